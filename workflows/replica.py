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
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.workflow import ActivityHandle

with workflow.unsafe.imports_passed_through():
    # Imported by its full name: `from workflows import history_budget` would hand the sandbox
    # its own copy (the package is loaded inside it), which tests could not set.
    import workflows.history_budget as history_budget
    from workflows import options
    from workflows.addresses import http_base
    from workflows.cancel_refusal import refusing_cancel
    from workflows.contracts import (
        Allocation,
        EngineExit,
        FetchOutcome,
        LaunchResult,
        PlacementRequest,
        ReleaseRequest,
        ReplicaInput,
        ReplicaPhase,
        ReplicaReady,
        ReplicaState,
        ReplicaView,
        Route,
        ShardAllocation,
        StopReplica,
        UpdateAdapters,
    )
    from workflows.ledger_activity import call_ledger, node_gone
    from workflows.messages import ARTIFACT_FETCHED, MODEL_REPLICA_READY
    from workflows.names import ControlActivity
    from workflows.replica_adapters import ReplicaAdapterSteps
    from workflows.replica_adoption import held_allocation
    from workflows.replica_calls import (
        await_shared_fetches,
        cancel_all,
        fetch_artifacts,
        label,
        request_placement,
        start_launch,
        start_stop,
        start_supervise,
        start_wait_ready,
    )
    from workflows.replica_fetch_wait import FetchWaits, wait_for_fetches
    from workflows.replica_rules import (
        artifacts_to_fetch,
        new_replica_state,
        profile_fingerprint,
        profile_index,
        replica_route,
        short_reason,
        taken_ports,
    )
    from workflows.replica_rules import restart_backoff as restart_backoff  # re-exported

# Each guards a change to the command sequence that histories recorded before it would hit.
# patched() is asked only where the new code would first differ, so a run replayed from an old
# history keeps its old behaviour only where that history needs it.
PATCH_START_RACES_STOP = "replica-start-races-stop"
PATCH_STOP_UNTIL_STOPPED = "replica-stop-until-stopped-or-node-gone"
PATCH_TRY_STOP_ON_GONE_NODE = "replica-try-stop-on-gone-node"
PATCH_MOVE_OFF_CRASH_LOOP = "replica-move-off-crash-looping-node"
PATCH_CONTINUE_AS_NEW = "replica-continue-as-new"
PATCH_SKIP_TAKEN_PORTS = "replica-skips-ports-taken-by-others"
PATCH_SHARED_FETCH = "replica-fetches-through-artifact-fetch-workflow"
# A new run placed itself, and published "starting" before its launch: started again after an
# operator terminated its predecessor, it took its healthy engine out of service meanwhile. Now
# it takes the allocation held under its ID, if any, and adopts the engine quietly.
PATCH_ADOPT_HELD = "replica-adopts-what-its-predecessor-held"
# A cancel request ended the replica as cancelled (its model then started it again). Now it is
# refused (workflows/cancel_refusal.py).
PATCH_REFUSES_CANCEL = "replica-refuses-cancel"
# Replicas from before waited for a shared fetch inside a control activity, holding one of the
# control worker's slots for as long as the download took; now they wait in the workflow.
PATCH_FETCH_WAIT_IN_WORKFLOW = "replica-waits-for-fetches-in-its-workflow"


@workflow.defn(name="Replica")
class ReplicaWorkflow(ReplicaAdapterSteps):
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
            await self._take_held_allocation()
        if workflow.patched(PATCH_REFUSES_CANCEL):
            return await refusing_cancel(self._live(), "stop a replica with its `stop` signal")
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
        """A node's fetch this replica waits on is over (workflows/replica_fetch_wait.py)."""
        self.fetch_waits.take(outcome)

    @workflow.query(name="describe")
    def describe(self) -> ReplicaView:
        return self.view

    # --- life ----------------------------------------------------------------------------

    async def _continue_as_new_if_due(self) -> None:
        """At a safe point: everything this run knows is in self.s, nothing is in flight."""
        if not history_budget.time_to_continue() or not workflow.patched(PATCH_CONTINUE_AS_NEW):
            return
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
        if self.s.failures_on_node >= options.CRASH_LOOP_LIMIT and workflow.patched(
            PATCH_MOVE_OFF_CRASH_LOOP
        ):
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

    # --- one engine run -------------------------------------------------------------------

    async def _run_engine_once(self, alloc: Allocation) -> EngineExit:
        """Start (or adopt) the engine's shards, wait for the leader to serve, route to it, and
        supervise every shard until one exits or a stop is asked for.

        A multi-node replica starts its leader first (the workers connect to it), and its
        workers are judged by staying alive while the leader loads: the rendezvous wait is the
        leader's readiness timeout. One shard ending ends the replica; all restart together."""
        shards = alloc.shards_or_leader()
        leader = shards[0]
        self.s.exit_report = None
        self._launch_with_next_model(alloc)
        artifacts = artifacts_to_fetch(self.inp.model, alloc.profile_index)
        # Taking over a predecessor's engine: its route stays as it was until that engine is
        # known to be the one wanted (adopted) and ready.
        quiet, self.s.adopt = self.s.adopt, False
        await self._set_state(
            ReplicaState.STARTING, "fetching the weights" if artifacts else "", publish=not quiet
        )
        if artifacts:
            nodes = list(dict.fromkeys(shard.node for shard in shards))

            def stopped() -> bool:
                return self.s.stop is not None

            model = self.inp.model.name
            if workflow.patched(PATCH_FETCH_WAIT_IN_WORKFLOW):
                # One ArtifactFetch workflow per node and artifact, shared with the node's other
                # replicas, shown in `llmgw fetches` and the Temporal UI; it signals the end.
                why_not = await wait_for_fetches(self.fetch_waits, model, artifacts, nodes, stopped)
            elif workflow.patched(PATCH_SHARED_FETCH):
                why_not = await await_shared_fetches(model, artifacts, nodes, stopped)
            else:
                why_not = await fetch_artifacts(artifacts, nodes, stopped)
            if why_not is not None:
                return self._exit(why_not)
        pids = []
        adopted = True
        for shard in shards:
            launch = await self._launch(alloc, shard)
            if launch is None:
                return self._exit("stop requested")
            if isinstance(launch, ActivityError):
                if len(shards) > 1:
                    await self._stop_engine(alloc)
                if taken_ports(launch) is not None and workflow.patched(PATCH_SKIP_TAKEN_PORTS):
                    return await self._leave_taken_ports(launch)
                where = f" on {shard.node}" if len(shards) > 1 else ""
                return self._exit(f"start failed{where}: {launch.cause}")
            pids.append(f"{shard.node}:{launch.pid}" if len(shards) > 1 else f"{launch.pid}")
            adopted = adopted and launch.adopted
            if shard is leader:
                self.s.kv = launch.kv
        await self._set_state(
            ReplicaState.LOADING, f"pid {', '.join(pids)}", publish=not (quiet and adopted)
        )

        workers = [start_supervise(self.inp.replica_id, shard) for shard in shards[1:]]
        ready_handle = start_wait_ready(self.inp.replica_id, leader)
        first = await self._first([ready_handle, *workers])
        if isinstance(first, EngineExit):
            return first
        if first is not ready_handle:  # a worker ended while the leader loaded
            return await self._end_all(alloc, [ready_handle, *workers], first)
        try:
            ready = ready_handle.result()
        except ActivityError as err:
            # The agent stayed away through every attempt: a fault to restart from, like an exit.
            return await self._end_all(alloc, workers, None, f"readiness: {err.cause}")
        if not ready.ready:
            await cancel_all(workers)
            await self._stop_engine(alloc)
            return self._exit(f"never ready: {ready.detail}")
        await self._set_state(ReplicaState.READY)
        await self._tell_model_ready()
        watched = [start_supervise(self.inp.replica_id, leader), *workers]
        while True:
            ended = await self._first(watched, lambda: self.s.next_model is not None)
            if ended is None:
                await self._update_adapters(alloc, lambda: any(h.done() for h in watched))
                continue
            if isinstance(ended, EngineExit):
                return ended
            return await self._end_all(alloc, watched, ended)

    async def _launch(
        self, alloc: Allocation, shard: ShardAllocation
    ) -> LaunchResult | ActivityError | None:
        """Start (or adopt) one shard's engine: its launch result, the launch's failure, or None
        when a stop was asked for first (a stop never waits for a node that does not answer)."""
        handle = start_launch(self.inp.replica_id, self.inp.model, alloc, shard)
        await workflow.wait_condition(lambda: handle.done() or self.s.stop is not None)
        if not handle.done() and workflow.patched(PATCH_START_RACES_STOP):
            await cancel_all([handle])
            return None
        try:
            launched: LaunchResult = await handle
        except ActivityError as err:
            return err
        return launched

    async def _first(
        self, handles: Sequence[ActivityHandle[Any]], wake: Callable[[], bool] = lambda: False
    ) -> ActivityHandle[Any] | EngineExit | None:
        """The first activity to finish, unless a stop is asked for or an agent reports the
        engine gone first: then every activity is cancelled and the interruption returned.
        None when `wake` turned true first (the activities run on)."""
        await workflow.wait_condition(
            lambda: (
                any(h.done() for h in handles) or bool(self.s.stop or self.s.exit_report) or wake()
            )
        )
        done = next((h for h in handles if h.done()), None)
        if done is not None:
            return done
        if not (self.s.stop or self.s.exit_report):
            return None
        await cancel_all(handles)
        if self.s.exit_report is not None:
            return self.s.exit_report
        return self._exit("stop requested")

    async def _end_all(
        self,
        alloc: Allocation,
        handles: Sequence[ActivityHandle[Any]],
        ended: ActivityHandle[Any] | None,
        reason: str = "",
    ) -> EngineExit:
        """One shard ended: the others cannot serve without it. Stop them before a restart, so
        the restart starts every shard afresh instead of adopting half a replica."""
        exit_info = self._exit(reason)
        if ended is not None:
            try:
                exit_info = ended.result()
            except ActivityError as err:
                exit_info = self._exit(f"supervision: {err.cause}")
        await cancel_all([h for h in handles if h is not ended])
        if len(alloc.shards_or_leader()) > 1:
            await self._stop_engine(alloc)
        return exit_info

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

    # --- stopping ---------------------------------------------------------------------------

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
            if not handle.done() and workflow.patched(PATCH_STOP_UNTIL_STOPPED):
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
        if not missed or not workflow.patched(PATCH_STOP_UNTIL_STOPPED):
            return True  # histories from before this: released anyway
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
                if workflow.patched(PATCH_TRY_STOP_ON_GONE_NODE):
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
