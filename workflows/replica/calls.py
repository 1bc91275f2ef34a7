"""The replica workflow's calls out: placement through the ledger, and the engine activities on
a node's agent (launch, readiness, supervision, stop), each with its timeouts and retries.

Each only schedules (or awaits) what the replica workflow (workflows/replica/workflow.py) asks for,
in
the order it asks: the workflow decides, these say how a call is made.
"""

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.workflow import ActivityHandle

with workflow.unsafe.imports_passed_through():
    from workflows import options, search_attributes
    from workflows.contracts import (
        Allocation,
        ArtifactFetchRequest,
        ArtifactFetchState,
        ArtifactFetchView,
        EngineExit,
        FetchArtifactRequest,
        FetchArtifactResult,
        LaunchRequest,
        LaunchResult,
        ModelSpec,
        PlacementAnswer,
        PlacementRefusal,
        PlacementRequest,
        ReadyRequest,
        ReadyResult,
        ReplicaView,
        SetAdaptersRequest,
        SetAdaptersResult,
        ShardAllocation,
        ShardRef,
        StopResult,
    )
    from workflows.names import ControlActivity, NodeActivity, node_task_queue
    from workflows.placement.refusal import NO_PLACEMENT

# What the ledger's `place` answers, told apart by its tag (contracts/ledger.py placement_kind),
# not by pydantic's union heuristics.
PLACEMENT_ANSWER: Any = PlacementAnswer


async def request_placement(req: PlacementRequest) -> Allocation | str:
    """The allocation, or why there is none (the ledger's summary)."""
    try:
        answer = await workflow.execute_activity(
            ControlActivity.LEDGER_PLACE,
            req,
            start_to_close_timeout=options.LEDGER_CALL_TIMEOUT,
            retry_policy=options.LEDGER_RETRY,
            result_type=PLACEMENT_ANSWER,
        )
    except ActivityError as err:
        # A ledger from before refusals were answers failed the call instead.
        cause = err.cause
        if not (isinstance(cause, ApplicationError) and cause.type == NO_PLACEMENT):
            raise
        return cause.message
    if isinstance(answer, PlacementRefusal):
        return f"no node can take it: {answer.summary}"
    assert isinstance(answer, Allocation)
    return answer


def start_launch(
    replica_id: str, model: ModelSpec, alloc: Allocation, shard: ShardAllocation
) -> ActivityHandle[LaunchResult]:
    """Start (or adopt) one shard's engine on its node."""
    return workflow.start_activity(
        NodeActivity.START_ENGINE,
        LaunchRequest(
            replica_id=replica_id,
            workflow_id=workflow.info().workflow_id,
            model=model,
            allocation=alloc,
        ),
        task_queue=node_task_queue(shard.node),
        start_to_close_timeout=options.START_TIMEOUT,
        schedule_to_close_timeout=options.START_GIVE_UP,
        retry_policy=options.START_RETRY,
        result_type=LaunchResult,
    )


async def all_done_unless_stopped(
    handles: Sequence[ActivityHandle[Any]], stopped: Callable[[], bool]
) -> bool:
    """True once every activity is done; False when a stop came first (each is cancelled)."""
    await workflow.wait_condition(lambda: all(h.done() for h in handles) or stopped())
    if all(h.done() for h in handles):
        return True
    await cancel_all(handles)
    return False


async def fetch_artifacts(
    artifacts: Sequence[str], nodes: Sequence[str], stopped: Callable[[], bool]
) -> str | None:
    """Each node fetches each artifact (the weights, the adapters) from the mirror, at once
    where it holds it: None once all hold them, else why not. A stop asked for meanwhile
    cancels the fetches (they resume from what is on disk next time) and answers "stop
    requested". What replicas did before await_shared_fetches(): kept for their histories."""
    wanted = [(node, artifact) for node in nodes for artifact in artifacts]
    handles = [
        workflow.start_activity(
            NodeActivity.FETCH_ARTIFACT,
            FetchArtifactRequest(manifest=artifact),
            task_queue=node_task_queue(node),
            start_to_close_timeout=options.FETCH_TIMEOUT,
            schedule_to_close_timeout=options.FETCH_GIVE_UP,
            heartbeat_timeout=options.FETCH_HEARTBEAT,
            retry_policy=options.FETCH_RETRY,
            result_type=FetchArtifactResult,
        )
        for node, artifact in wanted
    ]
    if not await all_done_unless_stopped(handles, stopped):
        return "stop requested"
    for (node, _), handle in zip(wanted, handles, strict=True):
        try:
            handle.result()
        except ActivityError as err:
            return f"fetching the weights failed on {node}: {err.cause}"
    return None


async def await_shared_fetches(
    model: str, artifacts: Sequence[str], nodes: Sequence[str], stopped: Callable[[], bool]
) -> str | None:
    """Each node fetches each artifact, as fetch_artifacts() does, but through the node's
    ArtifactFetch workflow for it (workflows/artifact_fetch.py), which every replica needing
    that artifact on that node joins: one download however many replicas wait. None once all
    are there, else why not.

    A stop asked for meanwhile ends only this replica's waits and answers "stop requested": the
    fetches go on, since another replica may be waiting on the same one, and what they download
    is what this replica needs should it start again. Each is bounded by FETCH_GIVE_UP, and an
    operator can cancel one (`temporal workflow cancel --workflow-id fetch:<node>:<hex>`)."""
    wanted = [(node, artifact) for node in nodes for artifact in artifacts]
    handles = [
        workflow.start_activity(
            ControlActivity.AWAIT_ARTIFACT_FETCH,
            ArtifactFetchRequest(node=node, manifest=artifact, model=model),
            start_to_close_timeout=options.AWAIT_FETCH_GIVE_UP,
            schedule_to_close_timeout=options.AWAIT_FETCH_GIVE_UP,
            heartbeat_timeout=options.AWAIT_FETCH_HEARTBEAT,
            retry_policy=options.AWAIT_FETCH_RETRY,
            result_type=ArtifactFetchView,
        )
        for node, artifact in wanted
    ]
    if not await all_done_unless_stopped(handles, stopped):
        return "stop requested"
    for (node, _), handle in zip(wanted, handles, strict=True):
        try:
            fetched = handle.result()
        except ActivityError as err:  # the control plane could not start or follow the fetch
            return f"fetching the weights failed on {node}: {err.cause}"
        if fetched.state != ArtifactFetchState.DONE:
            return f"fetching the weights failed on {node}: {fetched.error}"
    return None


async def set_adapters(
    req: SetAdaptersRequest, leader: ShardAllocation, interrupted: Callable[[], bool]
) -> SetAdaptersResult | None:
    """Have the leader's engine (the one serving HTTP) load and unload adapters until it serves
    exactly `req.adapters`. None when `interrupted` (a stop, the engine's exit) turned true
    first: the call is cancelled. Raises ActivityError when it failed."""
    handle = workflow.start_activity(
        NodeActivity.SET_ADAPTERS,
        req,
        task_queue=node_task_queue(leader.node),
        start_to_close_timeout=options.SET_ADAPTERS_TIMEOUT,
        schedule_to_close_timeout=options.SET_ADAPTERS_GIVE_UP,
        retry_policy=options.SET_ADAPTERS_RETRY,
        result_type=SetAdaptersResult,
    )
    await workflow.wait_condition(lambda: handle.done() or interrupted())
    if not handle.done():
        await cancel_all([handle])
        return None
    result: SetAdaptersResult = handle.result()
    return result


def start_wait_ready(replica_id: str, leader: ShardAllocation) -> ActivityHandle[ReadyResult]:
    """Wait on the leader's node until its engine serves (/health and /v1/models answer)."""
    return workflow.start_activity(
        NodeActivity.WAIT_READY,
        ReadyRequest(replica_id=replica_id, port=leader.port),
        task_queue=node_task_queue(leader.node),
        start_to_close_timeout=options.READY_TIMEOUT,
        schedule_to_close_timeout=options.READY_GIVE_UP,
        heartbeat_timeout=options.READY_HEARTBEAT,
        retry_policy=options.READY_RETRY,
        result_type=ReadyResult,
    )


def start_supervise(replica_id: str, shard: ShardAllocation) -> ActivityHandle[EngineExit]:
    """Supervise one shard: a long heartbeating activity that returns when it exits. Not
    bounded in time (an engine may serve for a year): it races the stop signal, which a
    model sends when the node is gone."""
    return workflow.start_activity(
        NodeActivity.SUPERVISE_ENGINE,
        ShardRef(replica_id=replica_id),
        task_queue=node_task_queue(shard.node),
        start_to_close_timeout=options.SUPERVISE_TIMEOUT,
        heartbeat_timeout=options.SUPERVISE_HEARTBEAT,
        retry_policy=options.SUPERVISE_RETRY,
        result_type=EngineExit,
    )


def start_stop(
    replica_id: str, shard: ShardAllocation, drain_s: float, give_up: timedelta
) -> ActivityHandle[StopResult]:
    """Stop one shard's engine, after up to `drain_s` for its in-flight requests."""
    return workflow.start_activity(
        NodeActivity.STOP_ENGINE,
        ShardRef(replica_id=replica_id, drain_s=drain_s),
        task_queue=node_task_queue(shard.node),
        start_to_close_timeout=options.STOP_TIMEOUT,
        schedule_to_close_timeout=give_up,
        retry_policy=options.STOP_RETRY,
        result_type=StopResult,
    )


async def cancel_all(handles: Sequence[ActivityHandle[Any]]) -> None:
    """Cancel every activity not done yet, and wait for each to end."""
    # TRY_CANCEL (the default) resolves at once even when the agent is gone.
    for handle in handles:
        if not handle.done():
            handle.cancel()
    for handle in handles:
        with contextlib.suppress(ActivityError, asyncio.CancelledError):
            await handle


def label(model: str, view: ReplicaView) -> None:
    """Model, node and state as search attributes, for the Temporal UI's filters."""
    workflow.upsert_search_attributes(
        [
            search_attributes.MODEL.value_set(model),
            search_attributes.NODE.value_set(view.node)
            if view.node
            else search_attributes.NODE.value_unset(),
            search_attributes.REPLICA_STATE.value_set(view.state.value),
        ]
    )
