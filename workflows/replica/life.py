"""The replica workflow's life between engine runs (workflows/replica/workflow.py mixes these steps
in): asking the ledger for room until it has some, taking over an allocation a predecessor under the
same ID left, one engine run followed by its restart backoff, moving off a node the engine keeps
failing on, leaving ports another program holds, and continuing as new at the safe points."""

import contextlib
from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    # Imported by its full name: `from workflows import history_budget` would hand the sandbox
    # its own copy (the package is loaded inside it), which tests could not set.
    import workflows.history_budget as history_budget
    from workflows import options
    from workflows.contracts import (
        Allocation,
        EngineExit,
        PlacementRequest,
        ReleaseRequest,
        ReplicaInput,
        ReplicaPhase,
        ReplicaState,
    )
    from workflows.ledger_activity import call_ledger
    from workflows.names import ControlActivity
    from workflows.replica.adoption import held_allocation
    from workflows.replica.calls import request_placement
    from workflows.replica.parts import ReplicaParts
    from workflows.replica.rules import restart_backoff, short_reason, taken_ports

# Retired (docs/workflow-versions.md): their old branches are gone; deprecate_patch() still
# replays the histories that carry their markers.
PATCH_MOVE_OFF_CRASH_LOOP = "replica-move-off-crash-looping-node"
PATCH_CONTINUE_AS_NEW = "replica-continue-as-new"


class ReplicaLifeSteps(ReplicaParts):
    """Mixed into ReplicaWorkflow (what it calls of the others: parts.py)."""

    async def _continue_as_new_if_due(self) -> None:
        """At a safe point: everything this run knows is in self.s, nothing is in flight."""
        if not history_budget.time_to_continue():
            return
        workflow.deprecate_patch(PATCH_CONTINUE_AS_NEW)
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(
            ReplicaInput(replica_id=self.inp.replica_id, model=self.inp.model, carried=self.s)
        )

    async def _sleep_unless(self, interrupt: Callable[[], bool], delay: timedelta) -> bool:
        """Sleep, unless `interrupt` turns true first; True when it did."""
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(interrupt, timeout=delay)
        return interrupt()

    async def _sleep_unless_stopped(self, delay: timedelta) -> None:
        await self._sleep_unless(lambda: self.s.stop is not None, delay)

    async def _place(self) -> None:
        """Ask the ledger for room until it has some or a stop is asked for."""
        while self.s.stop is None:
            alloc = await self._ask_for_room()
            if alloc is not None:
                self.s.allocation = alloc
                self.s.phase = ReplicaPhase.RUNNING
                self.s.placement_wait_s = 1.0
                self.s.exclude_nodes = []
                self.view.node = alloc.node
                return
            wait = timedelta(seconds=self.s.placement_wait_s)
            await self._sleep_unless_stopped(wait)
            self.s.placement_wait_s = min(wait * 2, options.PLACEMENT_RETRY_MAX).total_seconds()
            await self._continue_as_new_if_due()

    async def _take_held_allocation(self) -> None:
        """Run on the allocation a predecessor under this ID left, if any, adopting its engine."""
        alloc = await held_allocation(self.inp.replica_id)
        if alloc is None:
            return
        workflow.logger.info(
            "%s: taking over its allocation on %s", self.inp.replica_id, alloc.node
        )
        self.s.allocation = alloc
        self.s.phase = ReplicaPhase.RUNNING
        self.s.adopt = True
        self.view.node = alloc.node

    async def _ask_for_room(self) -> Allocation | None:
        m = self.inp.model
        req = PlacementRequest(
            replica_id=self.inp.replica_id,
            workflow_id=workflow.info().workflow_id,
            model=m.name,
            profiles=m.profiles,
            exclude_nodes=self.s.exclude_nodes,
            exclude_ports=self.s.taken_ports,
            artifact=m.artifact,
            artifact_size=m.artifact_size,
        )
        answer = await request_placement(req)
        if isinstance(answer, str) and self.s.exclude_nodes:
            # Nothing else fits: back where it failed, rather than nowhere.
            anywhere = await request_placement(req.model_copy(update={"exclude_nodes": []}))
            if isinstance(anywhere, Allocation):
                self.view.moved += f"; no other node can take it: back on {anywhere.node}"
                return anywhere
        if isinstance(answer, Allocation):
            return answer
        if self.view.detail != answer:
            self.view.state = ReplicaState.PENDING
            self.view.detail = answer
            self._label()
            # Listed with its reason, so `llmgw status` and the gateway (503, not 404) know
            # the replica exists before it has a node.
            await call_ledger(ControlActivity.LEDGER_SET_ROUTE, self._route("", ""))
        return None

    async def _run_and_back_off(self) -> None:
        """One life of the engine; after it ends, count the failure and wait out the backoff,
        or move off a node it keeps failing on."""
        alloc = self.s.allocation
        assert alloc is not None
        started = workflow.now()
        exit_info = await self._run_engine_once(alloc)
        if self.s.stop is not None or self.s.phase == ReplicaPhase.PLACING:
            return
        long_run = workflow.now() - started >= options.RESTART_BACKOFF_RESET_AFTER
        self.s.failures = 1 if long_run else self.s.failures + 1
        self.s.failures_on_node = 1 if long_run else self.s.failures_on_node + 1
        self.s.last_failure = short_reason(exit_info)
        self.view.restarts += 1
        if self.s.failures_on_node >= options.CRASH_LOOP_LIMIT:
            workflow.deprecate_patch(PATCH_MOVE_OFF_CRASH_LOOP)
            self.s.phase = ReplicaPhase.MOVING
            return
        delay = restart_backoff(self.s.failures)
        await self._set_state(
            ReplicaState.RESTARTING,
            f"{self.s.last_failure}; restarting in {delay.total_seconds():.0f}s",
        )
        await self._sleep_unless_stopped(delay)
        await self._continue_as_new_if_due()

    async def _move_off(self) -> None:
        """Stop the engine on the node it keeps failing on, release, and place again without
        that node (placement falls back to it if no other node can take the replica)."""
        alloc = self.s.allocation
        assert alloc is not None
        self.view.moved = (
            f"re-placed after {self.s.failures_on_node} failures on {alloc.node}: "
            f"{self.s.last_failure}"
        )
        await self._set_state(ReplicaState.RESTARTING, self.view.moved)
        stopped = await self._stop_for_good(alloc, timedelta(0), lambda: self.s.stop is not None)
        if not stopped:
            return  # a stop was asked for: run() goes on to stop, which frees what is held
        await call_ledger(
            ControlActivity.LEDGER_RELEASE, ReleaseRequest(replica_id=self.inp.replica_id)
        )
        self.s.allocation = None
        self.s.exclude_nodes = [alloc.node]
        self.s.failures_on_node = 0
        self.s.phase = ReplicaPhase.PLACING
        self.view.node = None
        self.view.detail = ""

    async def _leave_taken_ports(self, err: ActivityError) -> EngineExit:
        """Another program holds a port this replica was given: nothing started, so this is no
        crash to back off from. Release, and place again without those ports."""
        taken = taken_ports(err)
        assert taken is not None
        held = self.s.taken_ports.setdefault(taken.node, [])
        held.extend(p for p in taken.ports if p not in held)
        ports = ", ".join(str(p) for p in taken.ports)
        reason = f"port {ports} on {taken.node} is held by another program; placing again"
        self.view.detail = reason
        await call_ledger(
            ControlActivity.LEDGER_RELEASE, ReleaseRequest(replica_id=self.inp.replica_id)
        )
        self.s.allocation = None
        self.s.phase = ReplicaPhase.PLACING
        self.view.node = None
        return self._exit(reason)
