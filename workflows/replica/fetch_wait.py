"""A replica's wait for its nodes' fetches of its artifacts, in its own workflow.

Each (node, artifact) is joined with a short control activity (`control_join_artifact_fetch`:
a signal-with-start of the node's ArtifactFetch workflow, workflows/artifact_fetch.py) that
registers this workflow as a waiter under a fresh ticket; the fetch signals the outcome back
(`artifact_fetched`), at once if it is already over. Between the join and the signal nothing
runs on a worker: a thousand replicas waiting hours for their weights hold no activity slot, so
placements, route changes and releases on the control queue go on in their normal time.

A fetch that closed without telling (an operator terminated it) is noticed at the next re-join,
every FETCH_REJOIN, which starts it again; the whole wait is bounded by AWAIT_FETCH_GIVE_UP, as
the activity it replaces was. A stop ends only this replica's wait: the fetch goes on for its
other waiters.
"""

import contextlib
from collections.abc import Callable, Sequence

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.contracts import (
        ArtifactFetchRequest,
        ArtifactFetchState,
        ArtifactFetchView,
        FetchOutcome,
        FetchWaiter,
        JoinArtifactFetch,
    )
    from workflows.names import ControlActivity
    from workflows.replica.calls import all_done_unless_stopped


class FetchWaits:
    """The outcomes this workflow's current wait has been signalled, by ticket. Kept in memory
    only: a replica never continues as new while it waits for a fetch."""

    def __init__(self) -> None:
        self.tickets: set[str] = set()
        self.outcomes: dict[str, ArtifactFetchView] = {}

    def take(self, outcome: FetchOutcome) -> None:
        """A fetch's signal: kept if this wait asked for it (a late answer to an earlier,
        abandoned wait is dropped)."""
        if outcome.ticket in self.tickets:
            self.outcomes[outcome.ticket] = outcome.view

    def start(self, count: int) -> list[str]:
        """Fresh tickets for a new wait; earlier outcomes are forgotten."""
        self.tickets = {str(workflow.uuid4()) for _ in range(count)}
        self.outcomes = {}
        return sorted(self.tickets)

    def answered(self) -> bool:
        return self.tickets <= self.outcomes.keys()


async def wait_for_fetches(
    waits: FetchWaits,
    model: str,
    artifacts: Sequence[str],
    nodes: Sequence[str],
    stopped: Callable[[], bool],
) -> str | None:
    """Each node fetches each artifact, shared with the node's other replicas: None once all
    are there, else why not ("stop requested" when `stopped` turned true first)."""
    wanted = [(node, artifact) for node in nodes for artifact in artifacts]
    tickets = dict(zip(wanted, waits.start(len(wanted)), strict=True))
    me = workflow.info().workflow_id
    give_up_at = workflow.now() + options.AWAIT_FETCH_GIVE_UP
    while not waits.answered():
        unanswered = [pair for pair in wanted if tickets[pair] not in waits.outcomes]
        joins = [
            _start_join(JoinArtifactFetch(
                request=ArtifactFetchRequest(node=node, manifest=artifact, model=model),
                waiter=FetchWaiter(workflow_id=me, ticket=tickets[(node, artifact)]),
            ))
            for node, artifact in unanswered
        ]  # fmt: skip
        if not await all_done_unless_stopped(joins, stopped):
            return "stop requested"
        for (node, _), join in zip(unanswered, joins, strict=True):
            try:
                join.result()
            except ActivityError as err:  # the control plane could not start or reach it
                return f"fetching the weights failed on {node}: {err.cause}"
        left = give_up_at - workflow.now()
        if left <= options.JOIN_FETCH_TIMEOUT:
            hours = options.AWAIT_FETCH_GIVE_UP.total_seconds() / 3600
            return f"fetching the weights failed on {unanswered[0][0]}: no end in {hours:g} h"
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(
                lambda: waits.answered() or stopped(), timeout=min(options.FETCH_REJOIN, left)
            )
        if stopped():
            return "stop requested"
    for (node, _), ticket in tickets.items():
        view = waits.outcomes[ticket]
        if view.state != ArtifactFetchState.DONE:
            return f"fetching the weights failed on {node}: {view.error}"
    return None


def _start_join(join: JoinArtifactFetch) -> workflow.ActivityHandle[FetchWaiter]:
    return workflow.start_activity(
        ControlActivity.JOIN_ARTIFACT_FETCH,
        join,
        start_to_close_timeout=options.JOIN_FETCH_TIMEOUT,
        schedule_to_close_timeout=options.JOIN_FETCH_GIVE_UP,
        retry_policy=options.JOIN_FETCH_RETRY,
        result_type=FetchWaiter,
    )
