"""A replica's wait for its node's fetch of an artifact: start the ArtifactFetch workflow
(workflows/artifact_fetch.py), or join the one already running.

Today's replicas join with `control_join_artifact_fetch`: a signal-with-start that registers
the replica as a waiter and returns at once; the fetch signals the replica its outcome, and
the replica waits in its own workflow (workflows/replica/fetch_wait.py). A wait holds no
activity slot, however many replicas wait and however long the downloads take.

What follows is `control_await_artifact_fetch`, the activity replicas from before waited in:
kept registered for the waits those runs still have in flight.

Why an activity and not a child workflow: a child cannot be started with the USE_EXISTING
conflict policy, so a second replica on the node would get "already started" and have nothing
to wait on but polling, while a client start joins the running fetch and its result() waits
for it. Two replicas that need the same weights on one node therefore download them once.

The wait heartbeats: a control worker that dies is noticed within the replica's heartbeat
timeout (workflows/options.py AWAIT_FETCH_*), and the retry joins the same fetch. A cancelled
wait (the replica was asked to stop) ends only the wait: the fetch goes on for whoever else
waits on it, and what it downloads is there when this replica starts again.
"""

import asyncio
from collections.abc import Callable
from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import ApplicationError, FailureError, WorkflowAlreadyStartedError

from workflows import search_attributes
from workflows.artifact_fetch import ArtifactFetchWorkflow
from workflows.contracts import (
    ArtifactFetchRequest,
    ArtifactFetchState,
    ArtifactFetchView,
    FetchWaiter,
    JoinArtifactFetch,
)
from workflows.names import CONTROL_TASK_QUEUE, ControlActivity, artifact_fetch_workflow_id

# Far inside AWAIT_FETCH_HEARTBEAT; the SDK sends at most one per 80% of the timeout anyway.
HEARTBEAT_S = 5.0


async def start_or_join_fetch(
    client: Client, req: ArtifactFetchRequest, task_queue: str = CONTROL_TASK_QUEUE
) -> WorkflowHandle[ArtifactFetchWorkflow, ArtifactFetchView]:
    """The node's running fetch of the artifact, started if there is none."""
    return await client.start_workflow(
        ArtifactFetchWorkflow.run,
        req,
        id=artifact_fetch_workflow_id(req.node, req.manifest),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        # A closed fetch (done or failed) is no obstacle: a new run asks the node again, which
        # answers at once for an artifact it holds.
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        search_attributes=TypedSearchAttributes(
            [SearchAttributePair(search_attributes.NODE, req.node)]
        ),
        static_summary=fetch_summary(req),
    )


async def join_fetch(
    client: Client, join: JoinArtifactFetch, task_queue: str = CONTROL_TASK_QUEUE
) -> None:
    """Register `join.waiter` with the node's fetch of the artifact: signal the running fetch,
    or start a new run with the signal when none runs. One call to Temporal, atomic: a fetch
    cannot close between finding it and registering with it."""
    req = join.request
    await client.start_workflow(
        ArtifactFetchWorkflow.run,
        req,
        id=artifact_fetch_workflow_id(req.node, req.manifest),
        task_queue=task_queue,
        start_signal="wait",
        start_signal_args=[join.waiter],
        # A closed fetch (done or failed) is no obstacle: a new run asks the node again, which
        # answers at once for an artifact it holds.
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        search_attributes=TypedSearchAttributes(
            [SearchAttributePair(search_attributes.NODE, req.node)]
        ),
        static_summary=fetch_summary(req),
    )


def fetch_summary(req: ArtifactFetchRequest) -> str:
    """What the Temporal UI shows beside the workflow's ID."""
    wanted = f" for {req.model}" if req.model else ""
    return f"{req.node} fetches {req.manifest}{wanted} from the mirror"


def failed_view(req: ArtifactFetchRequest, err: WorkflowFailureError) -> ArtifactFetchView:
    """A fetch that failed, was cancelled or was terminated, in the node's words."""
    cause = err.cause
    error = cause.message if isinstance(cause, FailureError) else str(cause)
    return ArtifactFetchView(
        node=req.node,
        manifest=req.manifest,
        model=req.model,
        state=ArtifactFetchState.FAILED,
        error=error or str(err),
        error_type=getattr(cause, "type", None) or type(cause).__name__,
    )


class ArtifactFetchActivities:
    def __init__(self, client: Client) -> None:
        self.client = client

    def all(self) -> list[Callable[..., Any]]:
        return [self.join, self.await_fetch]

    @activity.defn(name=ControlActivity.JOIN_ARTIFACT_FETCH)
    async def join(self, join: JoinArtifactFetch) -> FetchWaiter:
        """The waiter, registered with the fetch; the outcome arrives as a signal to it."""
        # The queue this activity came from is the control queue of the workflow that asked.
        try:
            await join_fetch(self.client, join, activity.info().task_queue)
        except WorkflowAlreadyStartedError as err:
            # Signal-with-start met the fetch between two of its runs (seen on the time-skipping
            # test server while a fetch continued as new). Raised as it is, the SDK reported a
            # failure that server refuses to record, and the activity waited out its timeout;
            # as an application error it is retried at once, and the next try signals the run.
            raise ApplicationError(
                f"the fetch is between runs ({err}); asking again", type="FetchBetweenRuns"
            ) from None
        return join.waiter

    @activity.defn(name=ControlActivity.AWAIT_ARTIFACT_FETCH)
    async def await_fetch(self, req: ArtifactFetchRequest) -> ArtifactFetchView:
        """The fetch's outcome: DONE, or FAILED with the node's reason (a failure is an answer,
        not an error: retrying the wait would not change it)."""
        # The queue this activity came from is the control queue of the workflow that asked.
        handle = await start_or_join_fetch(self.client, req, activity.info().task_queue)
        waiting = asyncio.ensure_future(handle.result())
        try:
            while True:
                activity.heartbeat()
                done, _ = await asyncio.wait({waiting}, timeout=HEARTBEAT_S)
                if done:
                    break
        finally:
            waiting.cancel()  # cancelled: stop waiting; the fetch itself goes on
        try:
            return waiting.result()
        except WorkflowFailureError as err:
            return failed_view(req, err)
