"""One replica of a model, from placement to release.

place -> start the engine on its node -> wait until /health and /v1/models answer -> routable ->
supervise (a long heartbeating activity on the node) -> on exit, restart with backoff -> on stop,
stop the engine, drop the route, release the resources.

Every step is idempotent on its far side (placement per replica id, launch adopts a process it
already started), so a control worker killed mid-step resumes without a second engine or a
second reservation.
"""

import asyncio
import contextlib
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.workflow import ActivityHandle

with workflow.unsafe.imports_passed_through():
    from workflows import options, search_attributes
    from workflows.contracts import (
        Allocation,
        EngineExit,
        LaunchRequest,
        LaunchResult,
        LedgerAck,
        PlacementRequest,
        Profile,
        ReadyRequest,
        ReadyResult,
        ReleaseRequest,
        ReplicaInput,
        ReplicaReady,
        ReplicaState,
        ReplicaView,
        Route,
        ShardAllocation,
        ShardRef,
        StopReplica,
        StopResult,
    )
    from workflows.ledger import NO_PLACEMENT
    from workflows.names import CONTROL_TASK_QUEUE, ControlActivity, NodeActivity, node_task_queue


def restart_backoff(consecutive_failures: int) -> timedelta:
    seconds = 2 ** max(consecutive_failures - 1, 0)
    return min(timedelta(seconds=seconds), options.RESTART_BACKOFF_MAX)


@workflow.defn(name="Replica")
class ReplicaWorkflow:
    @workflow.init
    def __init__(self, inp: ReplicaInput) -> None:
        self.inp = inp
        self.view = ReplicaView(
            replica_id=inp.replica_id, model=inp.model.name, state=ReplicaState.PENDING
        )
        self.alloc: Allocation | None = None
        self.stop_request: StopReplica | None = None
        self.exit_report: EngineExit | None = None

    @workflow.run
    async def run(self, inp: ReplicaInput) -> ReplicaView:
        self.alloc = await self._place()
        failures = 0
        while self.alloc is not None and self.stop_request is None:
            started = workflow.now()
            exit_info = await self._run_engine_once(self.alloc)
            if self.stop_request is not None:
                break
            ran_for = workflow.now() - started
            failures = 1 if ran_for >= options.RESTART_BACKOFF_RESET_AFTER else failures + 1
            self.view.restarts += 1
            delay = restart_backoff(failures)
            await self._set_state(
                ReplicaState.RESTARTING,
                f"{exit_info.reason}; restarting in {delay.total_seconds():.0f}s",
            )
            await self._sleep_unless_stopped(delay)
        await self._stop()
        return self.view

    @workflow.signal(name="stop")
    def stop(self, req: StopReplica) -> None:
        self.stop_request = req

    @workflow.signal(name="engine_exited")
    def engine_exited(self, report: EngineExit) -> None:
        """An agent found this replica's engine gone (e.g. after its own restart)."""
        self.exit_report = report

    @workflow.query(name="describe")
    def describe(self) -> ReplicaView:
        return self.view

    async def _sleep_unless_stopped(self, delay: timedelta) -> None:
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(lambda: self.stop_request is not None, timeout=delay)

    async def _place(self) -> Allocation | None:
        m = self.inp.model
        req = PlacementRequest(
            replica_id=self.inp.replica_id,
            workflow_id=workflow.info().workflow_id,
            model=m.name,
            profiles=m.profiles,
        )
        wait = timedelta(seconds=1)
        while self.stop_request is None:
            try:
                alloc: Allocation = await workflow.execute_activity(
                    ControlActivity.LEDGER_PLACE,
                    req,
                    task_queue=CONTROL_TASK_QUEUE,
                    start_to_close_timeout=options.LEDGER_CALL_TIMEOUT,
                    retry_policy=options.LEDGER_RETRY,
                    result_type=Allocation,
                )
            except ActivityError as err:
                cause = err.cause
                if not (isinstance(cause, ApplicationError) and cause.type == NO_PLACEMENT):
                    raise
                if self.view.detail != cause.message:
                    self.view.state = ReplicaState.PENDING
                    self.view.detail = cause.message
                    self._label()
                    # Listed with its reason, so `llmgw status` and the gateway (503, not 404)
                    # know the replica exists before it has a node.
                    await self._ledger(ControlActivity.LEDGER_SET_ROUTE, self._route("", ""))
                await self._sleep_unless_stopped(wait)
                wait = min(wait * 2, options.PLACEMENT_RETRY_MAX)
                continue
            self.view.node = alloc.node
            return alloc
        return None

    async def _run_engine_once(self, alloc: Allocation) -> EngineExit:
        """Start (or adopt) the engine's shards, wait for the leader to serve, route to it, and
        supervise every shard until one exits or a stop is asked for.

        A multi-node replica starts its leader first (the workers connect to it), and its
        workers are judged by staying alive while the leader loads: the rendezvous wait is the
        leader's readiness timeout. One shard ending ends the replica; all restart together."""
        shards = alloc.shards_or_leader()
        leader = shards[0]
        self.exit_report = None
        await self._set_state(ReplicaState.STARTING)
        pids = []
        for shard in shards:
            try:
                launch: LaunchResult = await workflow.execute_activity(
                    NodeActivity.START_ENGINE,
                    LaunchRequest(
                        replica_id=self.inp.replica_id,
                        workflow_id=workflow.info().workflow_id,
                        model=self.inp.model,
                        allocation=alloc,
                    ),
                    task_queue=node_task_queue(shard.node),
                    start_to_close_timeout=options.START_TIMEOUT,
                    retry_policy=options.START_RETRY,
                    result_type=LaunchResult,
                )
            except ActivityError as err:
                if len(shards) > 1:
                    await self._stop_engine(alloc)
                where = f" on {shard.node}" if len(shards) > 1 else ""
                return self._exit(f"start failed{where}: {err.cause}")
            pids.append(f"{shard.node}:{launch.pid}" if len(shards) > 1 else f"{launch.pid}")
        await self._set_state(ReplicaState.LOADING, f"pid {', '.join(pids)}")

        workers = [self._watch(shard) for shard in shards[1:]]
        ready_handle = workflow.start_activity(
            NodeActivity.WAIT_READY,
            ReadyRequest(replica_id=self.inp.replica_id, port=leader.port),
            task_queue=node_task_queue(leader.node),
            start_to_close_timeout=options.READY_TIMEOUT,
            heartbeat_timeout=options.READY_HEARTBEAT,
            retry_policy=options.READY_RETRY,
            result_type=ReadyResult,
        )
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
            await self._cancel(workers)
            await self._stop_engine(alloc)
            return self._exit(f"never ready: {ready.detail}")
        await self._set_state(ReplicaState.READY)
        await self._tell_model_ready()
        watched = [self._watch(leader), *workers]
        ended = await self._first(watched)
        if isinstance(ended, EngineExit):
            return ended
        return await self._end_all(alloc, watched, ended)

    def _watch(self, shard: ShardAllocation) -> ActivityHandle[EngineExit]:
        """Supervise one shard: a long heartbeating activity that returns when it exits."""
        return workflow.start_activity(
            NodeActivity.SUPERVISE_ENGINE,
            ShardRef(replica_id=self.inp.replica_id),
            task_queue=node_task_queue(shard.node),
            start_to_close_timeout=options.SUPERVISE_TIMEOUT,
            heartbeat_timeout=options.SUPERVISE_HEARTBEAT,
            retry_policy=options.SUPERVISE_RETRY,
            result_type=EngineExit,
        )

    async def _first(
        self, handles: Sequence[ActivityHandle[Any]]
    ) -> ActivityHandle[Any] | EngineExit:
        """The first activity to finish, unless a stop is asked for or an agent reports the
        engine gone first: then every activity is cancelled and the interruption returned."""
        await workflow.wait_condition(
            lambda: any(h.done() for h in handles) or bool(self.stop_request or self.exit_report)
        )
        done = next((h for h in handles if h.done()), None)
        if done is not None:
            return done
        await self._cancel(handles)
        if self.exit_report is not None:
            return self.exit_report
        return self._exit("stop requested")

    async def _cancel(self, handles: Sequence[ActivityHandle[Any]]) -> None:
        # TRY_CANCEL (the default) resolves at once even when the agent is gone.
        for handle in handles:
            if not handle.done():
                handle.cancel()
        for handle in handles:
            with contextlib.suppress(ActivityError, asyncio.CancelledError):
                await handle

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
        await self._cancel([h for h in handles if h is not ended])
        if len(alloc.shards_or_leader()) > 1:
            await self._stop_engine(alloc)
        return exit_info

    def _exit(self, reason: str) -> EngineExit:
        return EngineExit(replica_id=self.inp.replica_id, reason=reason)

    async def _tell_model_ready(self) -> None:
        """A replica started to replace another lets its model stop the old one now."""
        parent = workflow.info().parent
        if parent is None:
            return
        # Addressed by ID without a run, so it reaches the model after a continue-as-new too.
        model = workflow.get_external_workflow_handle(parent.workflow_id)
        with contextlib.suppress(ApplicationError):
            ready = ReplicaReady(replica_id=self.inp.replica_id, fingerprint=self._fingerprint())
            await model.signal("replica_ready", ready)

    async def _stop_engine(self, alloc: Allocation, drain: timedelta = timedelta(0)) -> None:
        """Stop every shard, the leader first (it alone takes requests, so it alone drains)."""
        for shard in alloc.shards_or_leader():
            seconds = drain.total_seconds() if shard.rank == 0 else 0.0
            try:
                await workflow.execute_activity(
                    NodeActivity.STOP_ENGINE,
                    ShardRef(replica_id=self.inp.replica_id, drain_s=seconds),
                    task_queue=node_task_queue(shard.node),
                    start_to_close_timeout=options.STOP_TIMEOUT,
                    schedule_to_close_timeout=options.STOP_GIVE_UP,
                    retry_policy=options.STOP_RETRY,
                    result_type=StopResult,
                )
            except ActivityError as err:
                # The node's agent is gone. Release anyway: a returning agent stops any engine
                # that no running workflow owns, so nothing keeps serving unseen.
                workflow.logger.warning(
                    "could not stop %s on %s: %s", self.inp.replica_id, shard.node, err.cause
                )

    async def _stop(self) -> None:
        request = self.stop_request or StopReplica(reason="")
        if self.alloc is not None:
            was_serving = self.view.state == ReplicaState.READY
            await self._set_state(ReplicaState.STOPPING, request.reason)
            if not request.engine_gone:
                drain = timedelta(0)
                if was_serving:
                    # Gateways refresh routes about once a second: after this, no new request
                    # arrives, and the agent waits for those in flight before it stops the engine.
                    await workflow.sleep(options.ROUTE_PROPAGATION)
                    drain = options.DRAIN_TIMEOUT
                await self._stop_engine(self.alloc, drain)
        reason = request.reason
        self.view.state = ReplicaState.STOPPED
        self.view.detail = reason
        self._label()
        await self._ledger(
            ControlActivity.LEDGER_RELEASE, ReleaseRequest(replica_id=self.inp.replica_id)
        )

    def _label(self) -> None:
        """Model, node and state as search attributes, for the Temporal UI's filters."""
        workflow.upsert_search_attributes(
            [
                search_attributes.MODEL.value_set(self.inp.model.name),
                search_attributes.NODE.value_set(self.view.node)
                if self.view.node
                else search_attributes.NODE.value_unset(),
                search_attributes.REPLICA_STATE.value_set(self.view.state.value),
            ]
        )

    async def _set_state(self, state: ReplicaState, detail: str = "") -> None:
        self.view.state = state
        self.view.detail = detail
        self._label()
        assert self.alloc is not None
        endpoint = f"http://{self.alloc.address}:{self.alloc.port}"
        await self._ledger(ControlActivity.LEDGER_SET_ROUTE, self._route(self.alloc.node, endpoint))

    def _route(self, node: str, endpoint: str) -> Route:
        return Route(
            replica_id=self.inp.replica_id,
            model=self.inp.model.name,
            node=node,
            endpoint=endpoint,
            engine=self._profile().engine,
            state=self.view.state,
            fingerprint=self._fingerprint(),
            detail=self.view.detail,
        )

    def _profile_index(self) -> int:
        return self.alloc.profile_index if self.alloc is not None else 0

    def _profile(self) -> Profile:
        return self.inp.model.profiles[self._profile_index()]

    def _fingerprint(self) -> str:
        return self.inp.model.profile_fingerprint(self._profile_index())

    async def _ledger(self, activity_name: str, arg: Route | ReleaseRequest) -> None:
        await workflow.execute_activity(
            activity_name,
            arg,
            task_queue=CONTROL_TASK_QUEUE,
            start_to_close_timeout=options.LEDGER_CALL_TIMEOUT,
            retry_policy=options.LEDGER_RETRY,
            result_type=LedgerAck,
        )
