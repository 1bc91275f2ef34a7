"""Stopping the replica (workflows/replica/workflow.py mixes these steps in): every shard's engine
stopped, the leader first and drained when it served; a node that does not answer is asked
again, with backoff, until its engine stops or the ledger says the node is gone; then the
allocation is released. A stop never waits for a launch, and nothing waits forever on a dead
node.
"""

from collections.abc import Callable, Sequence
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.contracts import (
        Allocation,
        ReleaseRequest,
        ReplicaPhase,
        ReplicaState,
        ShardAllocation,
        StopReplica,
    )
    from workflows.ledger_activity import call_ledger, node_gone
    from workflows.names import ControlActivity
    from workflows.replica.calls import cancel_all, start_stop
    from workflows.replica.parts import ReplicaParts

# Retired (docs/workflow-versions.md): their old branches are gone; deprecate_patch() still
# replays the histories that carry their markers.
PATCH_STOP_UNTIL_STOPPED = "replica-stop-until-stopped-or-node-gone"
PATCH_TRY_STOP_ON_GONE_NODE = "replica-try-stop-on-gone-node"


class ReplicaStopping(ReplicaParts):
    """Mixed into ReplicaWorkflow (what it calls of the others: parts.py)."""

    async def _stop_engine(
        self,
        alloc: Allocation,
        drain: timedelta = timedelta(0),
        shards: Sequence[ShardAllocation] | None = None,
        give_up: timedelta = options.STOP_GIVE_UP,
        interrupt: Callable[[], bool] = lambda: False,
    ) -> list[ShardAllocation]:
        """Stop every shard (or those given), the leader first (it alone takes requests, so it
        alone drains). Returns the shards whose node's agent could not be reached, or that
        `interrupt` (the node declared gone meanwhile) stopped waiting for."""
        missed = []
        for shard in alloc.shards_or_leader() if shards is None else shards:
            seconds = drain.total_seconds() if shard.rank == 0 else 0.0
            handle = start_stop(self.inp.replica_id, shard, seconds, give_up)
            await workflow.wait_condition(lambda h=handle: h.done() or interrupt())  # type: ignore[misc]
            if not handle.done():
                workflow.deprecate_patch(PATCH_STOP_UNTIL_STOPPED)
                await cancel_all([handle])
                missed.append(shard)
                continue
            try:
                await handle
            except ActivityError as err:
                workflow.logger.warning(
                    "could not stop %s on %s: %s", self.inp.replica_id, shard.node, err.cause
                )
                missed.append(shard)
        return missed

    async def _stop_for_good(
        self, alloc: Allocation, drain: timedelta, interrupt: Callable[[], bool]
    ) -> bool:
        """Stop every shard. A shard whose node's agent cannot be reached is tried again, with
        backoff, until it stops or the ledger says its node is gone (lost or removed, or no
        longer known): until then the engine may still hold its devices, so the allocation is
        kept. False when `interrupt` turned true first."""
        missed = await self._stop_engine(alloc, drain, interrupt=interrupt)
        if not missed:
            return True
        workflow.deprecate_patch(PATCH_STOP_UNTIL_STOPPED)
        while True:
            if interrupt():
                return False
            missed = [shard for shard in missed if not await node_gone(shard.node)]
            if not missed:
                return True
            nodes = ", ".join(sorted({shard.node for shard in missed}))
            detail = (
                f"{self.view.detail.split('; stop not delivered', 1)[0]}; stop not delivered to "
                f"{nodes}: holding its resources until it stops the engine or is declared gone"
            )
            if detail != self.view.detail:
                await self._set_state(self.view.state, detail)
            wait = max(timedelta(seconds=self.s.stop_wait_s), options.STOP_RETRY_WAIT_FIRST)
            if await self._sleep_unless(interrupt, wait):
                return False
            self.s.stop_wait_s = min(wait * 2, options.STOP_RETRY_WAIT_MAX).total_seconds()
            await self._continue_as_new_if_due()
            missed = await self._stop_engine(alloc, shards=missed, interrupt=interrupt)
            if not missed:
                return True

    async def _stop(self) -> None:
        self.s.phase = ReplicaPhase.STOPPING
        request = self.s.stop or StopReplica(reason="")
        alloc = self.s.allocation
        if alloc is not None:
            was_serving = self.view.state == ReplicaState.READY
            await self._set_state(ReplicaState.STOPPING, request.reason)
            if request.engine_gone:
                # The node is gone by definition: one short try, then free what it held.
                workflow.deprecate_patch(PATCH_TRY_STOP_ON_GONE_NODE)
                await self._stop_engine(alloc, give_up=options.STOP_ON_GONE_NODE)
            else:
                drain = timedelta(0)
                if was_serving:
                    # Gateways refresh routes about once a second: after this, no new request
                    # arrives, and the agent waits for those in flight before it stops the engine.
                    await workflow.sleep(options.ROUTE_PROPAGATION)
                    drain = options.DRAIN_TIMEOUT

                def node_declared_gone() -> bool:
                    return self.s.stop is not None and self.s.stop.engine_gone

                await self._stop_for_good(alloc, drain, node_declared_gone)
        reason = (self.s.stop or request).reason
        self.view.state = ReplicaState.STOPPED
        self.view.detail = reason
        self._label()
        await call_ledger(
            ControlActivity.LEDGER_RELEASE, ReleaseRequest(replica_id=self.inp.replica_id)
        )
        self.s.allocation = None
