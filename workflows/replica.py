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
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.workflow import ActivityHandle

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.contracts import (
        Allocation,
        EngineExit,
        LaunchRequest,
        LaunchResult,
        LedgerAck,
        PlacementRequest,
        ReadyRequest,
        ReadyResult,
        ReleaseRequest,
        ReplicaInput,
        ReplicaReady,
        ReplicaState,
        ReplicaView,
        Route,
        ShardRef,
        StopReplica,
        StopResult,
    )
    from workflows.ledger import NO_PLACEMENT
    from workflows.names import CONTROL_TASK_QUEUE, ControlActivity, NodeActivity, node_task_queue


T = TypeVar("T")


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
            engine=m.engine,
            engine_version=m.engine_version,
            cpu_cores=m.cpu_cores,
            memory_mb=m.memory_mb,
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
        """Start (or adopt) the engine, wait for it to serve, route to it, and supervise it until
        it exits or a stop is asked for."""
        queue = node_task_queue(alloc.node)
        self.exit_report = None
        await self._set_state(ReplicaState.STARTING)
        try:
            launch: LaunchResult = await workflow.execute_activity(
                NodeActivity.START_ENGINE,
                LaunchRequest(
                    replica_id=self.inp.replica_id,
                    workflow_id=workflow.info().workflow_id,
                    model=self.inp.model,
                    allocation=alloc,
                ),
                task_queue=queue,
                start_to_close_timeout=options.START_TIMEOUT,
                retry_policy=options.START_RETRY,
                result_type=LaunchResult,
            )
        except ActivityError as err:
            return EngineExit(replica_id=self.inp.replica_id, reason=f"start failed: {err.cause}")
        await self._set_state(ReplicaState.LOADING, f"pid {launch.pid}")
        try:
            ready = await self._unless_interrupted(
                workflow.start_activity(
                    NodeActivity.WAIT_READY,
                    ReadyRequest(replica_id=self.inp.replica_id, port=alloc.port),
                    task_queue=queue,
                    start_to_close_timeout=options.READY_TIMEOUT,
                    heartbeat_timeout=options.READY_HEARTBEAT,
                    retry_policy=options.READY_RETRY,
                    result_type=ReadyResult,
                )
            )
        except ActivityError as err:
            # The agent stayed away through every attempt: a fault to restart from, like an exit.
            return EngineExit(replica_id=self.inp.replica_id, reason=f"readiness: {err.cause}")
        if isinstance(ready, EngineExit):
            return ready
        if not ready.ready:
            await self._stop_engine(alloc)
            return EngineExit(replica_id=self.inp.replica_id, reason=f"never ready: {ready.detail}")
        await self._set_state(ReplicaState.READY)
        await self._tell_model_ready()
        return await self._supervise(alloc)

    async def _supervise(self, alloc: Allocation) -> EngineExit:
        return await self._unless_interrupted(
            workflow.start_activity(
                NodeActivity.SUPERVISE_ENGINE,
                ShardRef(replica_id=self.inp.replica_id),
                task_queue=node_task_queue(alloc.node),
                start_to_close_timeout=options.SUPERVISE_TIMEOUT,
                heartbeat_timeout=options.SUPERVISE_HEARTBEAT,
                retry_policy=options.SUPERVISE_RETRY,
                result_type=EngineExit,
            )
        )

    async def _unless_interrupted(self, handle: ActivityHandle[T]) -> T | EngineExit:
        """The activity's result, unless a stop is asked for or an agent reports the engine gone
        first: then the activity is cancelled and the interruption returned as an exit."""
        await workflow.wait_condition(
            lambda: handle.done() or bool(self.stop_request or self.exit_report)
        )
        if handle.done():
            return handle.result()
        # TRY_CANCEL (the default) resolves at once even when the agent is gone.
        handle.cancel()
        with contextlib.suppress(ActivityError, asyncio.CancelledError):
            await handle
        if self.exit_report is not None:
            return self.exit_report
        return EngineExit(replica_id=self.inp.replica_id, reason="stop requested")

    async def _tell_model_ready(self) -> None:
        """A replica started to replace another lets its model stop the old one now."""
        parent = workflow.info().parent
        if parent is None:
            return
        # Addressed by ID without a run, so it reaches the model after a continue-as-new too.
        model = workflow.get_external_workflow_handle(parent.workflow_id)
        with contextlib.suppress(ApplicationError):
            await model.signal("replica_ready", ReplicaReady(replica_id=self.inp.replica_id))

    async def _stop_engine(self, alloc: Allocation, drain: timedelta = timedelta(0)) -> None:
        try:
            await workflow.execute_activity(
                NodeActivity.STOP_ENGINE,
                ShardRef(replica_id=self.inp.replica_id, drain_s=drain.total_seconds()),
                task_queue=node_task_queue(alloc.node),
                start_to_close_timeout=options.STOP_TIMEOUT,
                schedule_to_close_timeout=options.STOP_GIVE_UP,
                retry_policy=options.STOP_RETRY,
                result_type=StopResult,
            )
        except ActivityError as err:
            # The node's agent is gone. Release anyway: a returning agent stops any engine that
            # no running workflow owns, so nothing keeps serving unseen.
            workflow.logger.warning("could not stop %s: %s", self.inp.replica_id, err.cause)

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
        await self._ledger(
            ControlActivity.LEDGER_RELEASE, ReleaseRequest(replica_id=self.inp.replica_id)
        )

    async def _set_state(self, state: ReplicaState, detail: str = "") -> None:
        self.view.state = state
        self.view.detail = detail
        assert self.alloc is not None
        endpoint = f"http://{self.alloc.address}:{self.alloc.port}"
        await self._ledger(ControlActivity.LEDGER_SET_ROUTE, self._route(self.alloc.node, endpoint))

    def _route(self, node: str, endpoint: str) -> Route:
        return Route(
            replica_id=self.inp.replica_id,
            model=self.inp.model.name,
            node=node,
            endpoint=endpoint,
            engine=self.inp.model.engine,
            state=self.view.state,
            fingerprint=self.inp.model.fingerprint(),
            detail=self.view.detail,
        )

    async def _ledger(self, activity_name: str, arg: Route | ReleaseRequest) -> None:
        await workflow.execute_activity(
            activity_name,
            arg,
            task_queue=CONTROL_TASK_QUEUE,
            start_to_close_timeout=options.LEDGER_CALL_TIMEOUT,
            retry_policy=options.LEDGER_RETRY,
            result_type=LedgerAck,
        )
