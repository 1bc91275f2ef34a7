"""What a model does for a replica workflow that closed before it could finish stopping (an
operator terminated it mid-stop; and, in runs from before RESTART_UNBIDDEN_PATCH in
workflows/model/replica_checks.py, any replica an operator terminated): what the replica would
have done on its way out, had it been let. Its route is withdrawn, its engine stopped, and its
allocation released only once every shard's engine is known stopped or its node is gone; until
then the index waits in ModelState.unstopped and the stop is tried again at each check of the
replicas (workflows/model/replica_checks.py).
"""

import asyncio

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.contracts import (
        AllocationLookup,
        ModelState,
        ReleaseRequest,
        ReplicaAllocation,
        ReplicaState,
        Route,
        ShardRef,
        StopResult,
    )
    from workflows.ledger_activity import call_ledger, node_gone
    from workflows.names import (
        ControlActivity,
        NodeActivity,
        node_task_queue,
        replica_id,
    )

# Retired (docs/workflow-versions.md): the old branch is gone; deprecate_patch() still replays
# the histories that carry its marker.
FREE_WHEN_STOPPED_PATCH = "model-frees-dead-replica-once-stopped"


async def free_dead_replicas(state: ModelState, indices: list[int]) -> None:
    await asyncio.gather(*(free_dead_replica(state, i) for i in indices))


async def free_dead_replica(state: ModelState, index: int) -> None:
    """What a replica workflow would have done on its way out, had it been let: withdraw
    its route, stop its engine and release its allocation. The allocation is released only
    once every shard's engine is known stopped or its node is gone: until then the engine
    may still hold its devices, so the index waits in `unstopped` and is tried again at
    each check of the replicas."""
    spec = state.spec
    rid = replica_id(spec.name, index)
    held: ReplicaAllocation = await workflow.execute_activity(
        ControlActivity.LEDGER_ALLOCATION,
        AllocationLookup(replica_id=rid),
        start_to_close_timeout=options.LEDGER_CALL_TIMEOUT,
        retry_policy=options.LEDGER_RETRY,
        result_type=ReplicaAllocation,
    )
    alloc = held.allocation
    workflow.deprecate_patch(FREE_WHEN_STOPPED_PATCH)
    if alloc is None:
        if index in state.unstopped:
            state.unstopped.remove(index)
        return
    retry = index in state.unstopped
    if not retry:
        workflow.logger.warning("%s: its workflow closed; stopping its engine", rid)
        withdrawn = Route(
            replica_id=rid,
            model=spec.name,
            node=alloc.node,
            endpoint="",
            engine="",
            state=ReplicaState.STOPPED,
        )
        await call_ledger(ControlActivity.LEDGER_SET_ROUTE, withdrawn)
        await workflow.sleep(options.ROUTE_PROPAGATION)
    missed = []
    for shard in alloc.shards_or_leader():
        drain = options.ORPHAN_DRAIN.total_seconds() if shard.rank == 0 and not retry else 0.0
        try:
            await workflow.execute_activity(
                NodeActivity.STOP_ENGINE,
                ShardRef(replica_id=rid, drain_s=drain),
                task_queue=node_task_queue(shard.node),
                start_to_close_timeout=options.STOP_TIMEOUT,
                schedule_to_close_timeout=options.ORPHAN_STOP_GIVE_UP,
                retry_policy=options.STOP_RETRY,
                result_type=StopResult,
            )
        except ActivityError as err:
            workflow.logger.warning("%s: could not stop on %s: %s", rid, shard.node, err)
            missed.append(shard.node)
    holding = [node for node in missed if not await node_gone(node)]
    if holding:
        # Its agent does not answer but its node is not gone: the engine may still run and
        # hold the devices, so no successor may be placed on them yet.
        if not retry:
            state.unstopped.append(index)
        return
    if retry:
        state.unstopped.remove(index)
    await call_ledger(ControlActivity.LEDGER_RELEASE, ReleaseRequest(replica_id=rid))


async def retry_unstopped(state: ModelState) -> None:
    """Try again to stop the engine of each dead replica no stop has reached yet."""
    for index in list(state.unstopped):
        await free_dead_replica(state, index)
