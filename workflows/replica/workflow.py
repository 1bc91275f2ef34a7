"""One replica of a model, from placement to release.

place -> start the engine on its node -> wait until /health and /v1/models answer -> routable ->
supervise (a long heartbeating activity on the node) -> on exit, restart with backoff -> on stop,
stop the engine, drop the route, release the resources.

While it serves, a new adapter list from its model (`update_adapters`, for engines that load
adapters at runtime) is fetched to its nodes and loaded into the running engine by the node's
agent, and the route republished with it; a replica that cannot tells its model, which
replaces it.

Every step is idempotent on its far side (placement per replica id, launch adopts a process it
already started), so a control worker killed mid-step resumes without a second engine or a
second reservation.

A replica lives as long as its model wants it, so its history must stay bounded: its whole
state is one model (ReplicaCarried) and it continues as new at its safe points, between engine
restarts, while it waits for room, and while it waits for a node to take a stop. A continued
run resumes where the last one was: an allocated replica starts (or, on the agent, adopts) its
engine and never places a second time; a stop asked for is honoured.

Nothing waits forever on a dead node: a launch and a readiness check give up after a bound, and
a stop never waits for a launch. An allocation is freed only once its engine is known stopped,
or the ledger says its node is gone. A replica that keeps failing on one node moves to another.
"""

import contextlib

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from workflows.addresses import http_base
    from workflows.cancel_refusal import refusing_cancel
    from workflows.contracts import (
        Allocation,
        EngineExit,
        FetchOutcome,
        ReplicaInput,
        ReplicaPhase,
        ReplicaReady,
        ReplicaState,
        ReplicaView,
        Route,
        StopReplica,
        UpdateAdapters,
    )
    from workflows.ledger_activity import call_ledger
    from workflows.messages import ARTIFACT_FETCHED, MODEL_REPLICA_READY
    from workflows.names import ControlActivity
    from workflows.replica.adapters import ReplicaAdapterSteps
    from workflows.replica.calls import label
    from workflows.replica.engine_run import ReplicaEngineRun
    from workflows.replica.fetch_wait import FetchWaits
    from workflows.replica.life import ReplicaLifeSteps
    from workflows.replica.rules import (
        new_replica_state,
        profile_fingerprint,
        profile_index,
        replica_route,
        short_reason,
    )
    from workflows.replica.stopping import ReplicaStopping

# Each guards a change to the command sequence that histories recorded before it would hit.
# patched() is asked only where the new code would first differ, so a run replayed from an old
# history keeps its old behaviour only where that history needs it.
# The patches the steps ask are beside them (replica/life.py, replica/engine_run.py,
# replica/stopping.py, replica/adapters.py); docs/workflow-versions.md says when each retires.
# A new run placed itself, and published "starting" before its launch: started again after an
# operator terminated its predecessor, it took its healthy engine out of service meanwhile. Now
# it takes the allocation held under its ID, if any, and adopts the engine quietly.
PATCH_ADOPT_HELD = "replica-adopts-what-its-predecessor-held"
# A cancel request ended the replica as cancelled (its model then started it again). Now it is
# refused (workflows/cancel_refusal.py).
PATCH_REFUSES_CANCEL = "replica-refuses-cancel"


REFUSE_REMEDY = "stop a replica with its `stop` signal"


@workflow.defn(name="Replica")
class ReplicaWorkflow(ReplicaLifeSteps, ReplicaEngineRun, ReplicaStopping, ReplicaAdapterSteps):
    """The run loop, the signals and queries, and what the ledger, the model and the Temporal UI
    are told; its steps are mixed in: life between engine runs (replica/life.py), one engine run
    (replica/engine_run.py), stopping (replica/stopping.py), adapters at runtime
    (replica/adapters.py)."""

    @workflow.init
    def __init__(self, inp: ReplicaInput) -> None:
        self.inp = inp
        carried = inp.carried
        if carried is None:
            parent = workflow.info().parent
            carried = new_replica_state(inp, parent.workflow_id if parent is not None else "")
        self.s = carried
        self.fetch_waits = FetchWaits()

    @property
    def view(self) -> ReplicaView:
        return self.s.view

    @workflow.run
    async def run(self, inp: ReplicaInput) -> ReplicaView:
        if inp.carried is not None:
            self._label()
        elif workflow.patched(PATCH_ADOPT_HELD):
            # Refused here too: a cancel that came while a restarted run took over what its
            # predecessor held ended it as cancelled. No command changes, and an execution
            # that met such a cancel is closed, so no running one replays differently.
            await refusing_cancel(self._take_held_allocation(), REFUSE_REMEDY)
        if workflow.patched(PATCH_REFUSES_CANCEL):
            return await refusing_cancel(self._live(), REFUSE_REMEDY)
        return await self._live()

    async def _live(self) -> ReplicaView:
        while True:
            if self.s.stop is not None or self.s.phase == ReplicaPhase.STOPPING:
                await self._stop()
                return self.view
            if self.s.phase == ReplicaPhase.PLACING:
                await self._place()
            elif self.s.phase == ReplicaPhase.MOVING:
                await self._move_off()
            else:
                await self._run_and_back_off()

    @workflow.signal(name="stop")
    def stop(self, req: StopReplica) -> None:
        self.s.stop = req

    @workflow.signal(name="update_adapters")
    def update_adapters(self, req: UpdateAdapters) -> None:
        """Its model's new definition, differing for this replica at most in its adapters:
        taken at the next launch, or loaded into the running engine (_update_adapters)."""
        self.s.next_model = req.model

    @workflow.signal(name="engine_exited")
    def engine_exited(self, report: EngineExit) -> None:
        """An agent found this replica's engine gone (e.g. after its own restart)."""
        # Only the exit and its short reason are kept: whatever else an older agent sends (its
        # engine's log) is dropped here, so it is never carried into another run.
        self.s.exit_report = EngineExit(
            replica_id=report.replica_id, exit_code=report.exit_code, reason=short_reason(report)
        )

    @workflow.signal(name=ARTIFACT_FETCHED)
    def artifact_fetched(self, outcome: FetchOutcome) -> None:
        """A node's fetch this replica waits on is over (workflows/replica/fetch_wait.py)."""
        self.fetch_waits.take(outcome)

    @workflow.query(name="describe")
    def describe(self) -> ReplicaView:
        return self.view

    def _exit(self, reason: str) -> EngineExit:
        return EngineExit(replica_id=self.inp.replica_id, reason=reason)

    async def _tell_model_ready(self, *, adapters_at_runtime: bool = True) -> None:
        """A replica started to replace another lets its model stop the old one now. It says
        which profile it serves, and whether its engine takes adapter changes without a
        restart (`adapters_at_runtime` False: it could not, so its model replaces it)."""
        if not self.s.parent_workflow_id:
            return
        # Addressed by ID without a run, so it reaches the model after a continue-as-new too.
        model = workflow.get_external_workflow_handle(self.s.parent_workflow_id)
        restart = ""
        if adapters_at_runtime:
            restart = self.inp.model.restart_fingerprint(profile_index(self.s))
        with contextlib.suppress(ApplicationError):
            ready = ReplicaReady(
                replica_id=self.inp.replica_id,
                fingerprint=self._fingerprint(),
                restart_fingerprint=restart,
            )
            await model.signal(MODEL_REPLICA_READY, ready)

    # --- what the ledger and the Temporal UI show -----------------------------------------

    def _label(self) -> None:
        """Model, node and state as search attributes, for the Temporal UI's filters."""
        label(self.inp.model.name, self.view)

    async def _set_state(self, state: ReplicaState, detail: str = "", publish: bool = True) -> None:
        """Take `state`, and publish it as the replica's route unless told not to (the route
        then keeps what it said: a predecessor's engine being adopted)."""
        self.view.state = state
        self.view.detail = detail
        self._label()
        if not publish:
            return
        alloc = self.s.allocation
        assert alloc is not None
        endpoint = http_base(alloc.address, alloc.port)
        await call_ledger(ControlActivity.LEDGER_SET_ROUTE, self._route(alloc.node, endpoint))

    def _route(self, node: str, endpoint: str) -> Route:
        return replica_route(self.inp, self.s, node, endpoint)

    def _fingerprint(self) -> str:
        return profile_fingerprint(self.inp, self.s)

    @workflow.query(name="allocation")
    def allocation(self) -> Allocation | None:
        """What this replica holds, for `llmgw ledger rebuild` (None: not placed, or released)."""
        return self.s.allocation
