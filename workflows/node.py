"""A node's lifecycle: registration, engine convergence, liveness.

The agent registers with an update (update-with-start, so a brand-new node needs no separate
step) and then heartbeats with signals. Every change is copied to the ledger, which placement
reads. A node silent for longer than its grace is marked lost; its next heartbeat or
registration brings it back.
"""

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.contracts import (
        EngineInstallRequest,
        EngineState,
        EngineStatus,
        LedgerAck,
        NodeHeartbeat,
        NodeRecord,
        NodeRegistration,
        NodeState,
        NodeView,
    )
    from workflows.engine_install import EngineInstallWorkflow
    from workflows.names import (
        CONTROL_TASK_QUEUE,
        ControlActivity,
        engine_install_workflow_id,
    )


@workflow.defn(name="Node")
class NodeWorkflow:
    @workflow.init
    def __init__(self, view: NodeView | None = None) -> None:
        self.view = view
        self.pending: NodeRegistration | None = None
        self.heard = False

    @workflow.run
    async def run(self, view: NodeView | None = None) -> None:
        while True:
            if self.pending is not None:
                await self._onboard(self.pending)
            self.heard = False
            try:
                await workflow.wait_condition(
                    lambda: self.heard or self.pending is not None,
                    timeout=options.NODE_GRACE,
                )
            except TimeoutError:
                await self._set_state(NodeState.LOST)
            else:
                if self.heard and self.view and self.view.record.state == NodeState.LOST:
                    await self._set_state(NodeState.READY)
            if workflow.info().is_continue_as_new_suggested() and self.pending is None:
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(self.view)

    @workflow.update(name="register")
    def register(self, reg: NodeRegistration) -> NodeView:
        self.pending = reg
        return self._view_of(reg)

    @register.validator
    def _check_registration(self, reg: NodeRegistration) -> None:
        # A node cannot claim another node's workflow: its inventory must carry this node's name.
        expected = workflow.info().workflow_id.removeprefix("node:")
        if reg.inventory.name != expected:
            raise ValueError(f"node {reg.inventory.name!r} cannot register as {expected!r}")

    @workflow.signal(name="heartbeat")
    def heartbeat(self, beat: NodeHeartbeat) -> None:
        if self.view is not None and beat.boot_id == self.view.boot_id:
            self.heard = True

    @workflow.query(name="describe")
    def describe(self) -> NodeView | None:
        return self.view

    def _view_of(self, reg: NodeRegistration) -> NodeView:
        record = NodeRecord(inventory=reg.inventory, state=NodeState.READY)
        if self.view is not None:
            record.cordoned = self.view.record.cordoned
            record.engines = dict(self.view.record.engines)
        return NodeView(record=record, boot_id=reg.boot_id)

    async def _onboard(self, reg: NodeRegistration) -> None:
        self.pending = None
        self.view = self._view_of(reg)
        for req in reg.engines:
            self.view.record.engines[req.engine] = EngineStatus(
                engine=req.engine, version=req.version, state=EngineState.INSTALLING
            )
        await self._publish()
        # Installs run one at a time: each is a build or a large download on the same machine.
        for req in reg.engines:
            status = await workflow.execute_child_workflow(
                EngineInstallWorkflow.run,
                EngineInstallRequest(node=reg.inventory.name, requirement=req),
                id=engine_install_workflow_id(reg.inventory.name, req.engine, req.version),
                task_queue=CONTROL_TASK_QUEUE,
            )
            self.view.record.engines[req.engine] = status
            await self._publish()

    async def _set_state(self, state: NodeState) -> None:
        if self.view is None or self.view.record.state == state:
            return
        self.view.record.state = state
        await self._publish()

    async def _publish(self) -> None:
        assert self.view is not None
        await workflow.execute_activity(
            ControlActivity.LEDGER_UPSERT_NODE,
            self.view.record,
            task_queue=CONTROL_TASK_QUEUE,
            start_to_close_timeout=options.LEDGER_CALL_TIMEOUT,
            retry_policy=options.LEDGER_RETRY,
            result_type=LedgerAck,
        )
