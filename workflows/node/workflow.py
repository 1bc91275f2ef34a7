"""A node's lifecycle: onboarding, engine convergence, inventory, liveness and operator commands.

The agent registers with an update (update-with-start, so a brand-new node needs no separate
step) and then holds the node's liveness watch, an activity it heartbeats to Temporal (no
history event per heartbeat: workflows/node/watch.py); an agent from before the watch
heartbeats with signals instead. Operators cordon, uncordon, drain and remove with
signals, so `llmgw node ...` and `temporal workflow signal` do the same thing. The schedules
signal `refresh` to look at the machine again or re-verify its engines. Every change is copied
to the ledger, which placement reads.

Liveness has two steps, judged from how each watch ends, or for signals from a timer
(workflows/node/liveness.py). A node silent past its grace is unreachable: the ledger withdraws
its routes, and nothing else changes (its engines may well be serving; a partition that heals
restarts nothing). Silent past the longer gone grace it is lost: its models start its replicas
elsewhere. Silence the control plane caused is no evidence: a heartbeat timeout is only probed,
and a watch or timer that ran out late (Temporal or the control worker was away, so heartbeats
could not arrive) gives the node a fresh grace instead. A draining node keeps serving until
each replica's successor is ready elsewhere.
"""

import asyncio
from datetime import datetime

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from workflows import history_budget
    from workflows.cancel_refusal import refusing_cancel
    from workflows.contracts import (
        EngineInstallRequest,
        EnginePlan,
        EngineRequirement,
        EngineState,
        EngineStatus,
        NodeAdd,
        NodeCommand,
        NodeHeartbeat,
        NodeInventory,
        NodeRecord,
        NodeRefresh,
        NodeRegistration,
        NodeState,
        NodeView,
        ReplaceReplicas,
        ReplicaRefs,
        VerifyEnginesResult,
    )
    from workflows.engine_install import EngineInstallWorkflow
    from workflows.model.workflow import ModelWorkflow
    from workflows.names import (
        engine_install_workflow_id,
        model_workflow_id,
        node_task_queue,
    )
    from workflows.node.calls import (
        plan_engines,
        replicas_on,
        start_discover,
        start_verify,
        upsert_node,
    )
    from workflows.node.liveness import NodeLiveness
    from workflows.node.rules import (
        AgentSilent,
        apply_plan,
        check_add,
        check_registration,
        disabled_after,
        take_verified,
        view_of,
    )
    from workflows.node.watch import Watch

# Retired (docs/workflow-versions.md): their old branches are gone; deprecate_patch() still
# replays the histories that carry their markers.
UNREACHABLE_BEFORE_LOST = "unreachable-before-lost"
INSTALL_WATCHES_LIVENESS = "install-watches-liveness"
# Histories from before the liveness watch judge liveness from heartbeat signals alone.
LIVENESS_BY_WATCH = "liveness-by-watch"
# A cancel request ended the workflow as cancelled, which its agent read as the node removed:
# it stopped every engine. Now the workflow refuses it (workflows/cancel_refusal.py).
REFUSES_CANCEL = "node-refuses-cancel"
# An install child an operator terminated or cancelled failed the whole node workflow. Now it
# is started again, and after INSTALL_RESTARTS in a row reported failed with the reason.
INSTALL_RESTARTS_PATCH = "node-restarts-an-install-closed-unbidden"
INSTALL_RESTARTS = 3

# The operator commands, by signal name.
CORDON, UNCORDON, DRAIN, REMOVE = "cordon", "uncordon", "drain", "remove"


@workflow.defn(name="Node")
class NodeWorkflow(NodeLiveness):
    @workflow.init
    def __init__(self, view: NodeView | None = None) -> None:
        self.view = view
        self.pending: NodeRegistration | None = None
        self.commands: list[tuple[str, NodeCommand]] = []
        self.refresh_asked: NodeRefresh | None = None
        self.replan_asked = False  # the operator's disabled engines changed
        self.changed_inventory: NodeInventory | None = None
        self.last_heard: datetime | None = None
        self.last_published = False
        self.by_watch = False
        self.signal_beats = False
        self.watch = Watch()
        self.suspect = False
        self.reported_digest = ""

    @workflow.run
    async def run(self, view: NodeView | None = None) -> NodeView | None:
        workflow.deprecate_patch(UNREACHABLE_BEFORE_LOST)
        self.by_watch = workflow.patched(LIVENESS_BY_WATCH)
        # A new run goes on from when the agent was last heard (a silent node stays silent
        # across continue-as-new); a node with no record of it starts with a fresh grace.
        carried = view.last_heard if view is not None else None
        self.last_heard = carried or workflow.now()
        if view is not None:
            self.signal_beats, self.reported_digest = view.signal_beats, view.reported_digest
        if workflow.patched(REFUSES_CANCEL):
            return await refusing_cancel(self._live(), "remove a node with `llmgw node rm`")
        return await self._live()

    async def _live(self) -> NodeView | None:
        while True:
            await self._work()
            if self._state() == NodeState.REMOVED:
                return self.view
            if self.view is not None and self.view.record.draining:
                await self._follow_drain()
            if self._watching():
                await self._wait_watched()
                if self._time_to_continue() and not self._has_work():
                    await self._continue_as_new()
                continue
            timeout = self._until_lost()
            due = workflow.now() + timeout if timeout is not None else None
            try:
                await workflow.wait_condition(self._has_work, timeout=timeout)
            except TimeoutError:
                self._forgive_control_plane_outage(due)
                await self._lose()
            if self._time_to_continue() and not self._has_work():
                await self._continue_as_new()

    async def _continue_as_new(self) -> None:
        await workflow.wait_condition(workflow.all_handlers_finished)
        if self.view is not None:
            self.view.last_heard = self._heard_at()
            self.view.signal_beats, self.view.reported_digest = (
                self.signal_beats,
                self.reported_digest,
            )
        workflow.continue_as_new(self.view)

    def _time_to_continue(self) -> bool:
        return history_budget.time_to_continue()

    # --- messages -------------------------------------------------------------------------

    @workflow.update(name="register")
    def register(self, reg: NodeRegistration) -> NodeView:
        self.pending = reg
        return self._view_of(reg)

    @register.validator
    def _check_registration(self, reg: NodeRegistration) -> None:
        expected = workflow.info().workflow_id.removeprefix("node:")
        # A watched node is live until a watch says otherwise.
        heard = self._watching() or self._silent_for() < self._grace()
        live = self._state() == NodeState.READY and heard
        # A registration taken but not yet applied counts: its signature is spent already.
        view = self._view_of(self.pending) if self.pending is not None else self.view
        now_ms = int(workflow.now().timestamp() * 1000)
        check_registration(expected, reg, view, live, now_ms)

    @workflow.update(name="add")
    def add(self, req: NodeAdd) -> NodeView:
        """An operator expects this node (`llmgw node add`, scheduled onboarding)."""
        if self.view is None:
            inventory = NodeInventory(name=req.name, address=req.address or "127.0.0.1")
            record = NodeRecord(inventory=inventory, state=NodeState.AWAITING)
            self.view = NodeView(record=record)
        before = (dict(self.view.record.labels), self.view.identity)
        self.view.operator_labels.update(req.labels)
        self.view.record.labels.update(req.labels)
        self.view.identity = req.identity or self.view.identity
        if (self.view.record.labels, self.view.identity) != before or not self.last_published:
            self.refresh_asked = self.refresh_asked or NodeRefresh()  # publishes the change
        disabled = disabled_after(self.view, req)
        if disabled != self.view.disabled_engines:
            self.view.disabled_engines = disabled
            # A joined node plans its engines again; one still awaited plans at its join.
            self.replan_asked = self.view.record.state != NodeState.AWAITING
        return self.view

    @add.validator
    def _check_add(self, req: NodeAdd) -> None:
        check_add(workflow.info().workflow_id.removeprefix("node:"), req, self.view)

    @workflow.signal(name="heartbeat")
    def heartbeat(self, beat: NodeHeartbeat) -> None:
        if self.view is not None and beat.boot_id == self.view.boot_id:
            self.last_heard = workflow.now()
            if beat.inventory is not None:
                self.changed_inventory = beat.inventory

    @workflow.signal(name=CORDON)
    def cordon(self, cmd: NodeCommand) -> None:
        self.commands.append((CORDON, cmd))

    @workflow.signal(name=UNCORDON)
    def uncordon(self, cmd: NodeCommand) -> None:
        self.commands.append((UNCORDON, cmd))

    @workflow.signal(name=DRAIN)
    def drain(self, cmd: NodeCommand) -> None:
        self.commands.append((DRAIN, cmd))

    @workflow.signal(name=REMOVE)
    def remove(self, cmd: NodeCommand) -> None:
        self.commands.append((REMOVE, cmd))

    @workflow.signal(name="refresh")
    def refresh(self, req: NodeRefresh) -> None:
        asked = self.refresh_asked or NodeRefresh()
        self.refresh_asked = NodeRefresh(
            inventory=asked.inventory or req.inventory, engines=asked.engines or req.engines
        )

    @workflow.query(name="describe")
    def describe(self) -> NodeView | None:
        return self.view

    # --- the loop's work --------------------------------------------------------------------

    def _has_work(self) -> bool:
        changed = self.changed_inventory is not None or self.refresh_asked is not None
        changed = changed or self.replan_asked
        return self.pending is not None or bool(self.commands) or changed or self._back()

    def _state(self) -> NodeState | None:
        return self.view.record.state if self.view is not None else None

    async def _work(self) -> None:
        if self.pending is not None:
            reg, self.pending = self.pending, None
            await self._onboard(reg)
        while self.commands:
            name, cmd = self.commands.pop(0)
            await self._command(name, cmd)
            if self._state() == NodeState.REMOVED:
                return
        if self._back():
            await self._set_state(NodeState.READY)
        if self.changed_inventory is not None:
            inventory, self.changed_inventory = self.changed_inventory, None
            await self._take_inventory(inventory)
        if self.refresh_asked is not None:
            asked, self.refresh_asked = self.refresh_asked, None
            await self._refresh(asked)
        if self.replan_asked:
            # Only an add that changed the disabled engines asks: no earlier history holds one.
            self.replan_asked = False
            if self._state() == NodeState.READY:
                await self._converge_engines()

    async def _onboard(self, reg: NodeRegistration) -> None:
        self.view = self._view_of(reg)
        if self.by_watch:
            # A new boot is heard now, and takes a fresh watch: the one in flight may be held
            # by the agent it replaces, or have the long window of a lost node.
            self.watch.drop()
            self.last_heard, self.suspect, self.signal_beats = workflow.now(), False, False
            self.reported_digest = reg.inventory.digest()
        await self._converge_engines()

    def _view_of(self, reg: NodeRegistration) -> NodeView:
        return view_of(self.view, reg)

    async def _converge_engines(self) -> None:
        """Ask the control plane which engines this node gets, then install them one by one
        (each is a build or a large download on the same machine)."""
        assert self.view is not None
        record = self.view.record
        plan: EnginePlan = await plan_engines(self.view)
        todo = apply_plan(record, plan)
        await self._publish()
        for req in todo:
            try:
                status = await self._install(req)
            except AgentSilent as err:
                # The machine died mid-install: say so, and leave liveness to the main loop,
                # which now counts the node unreachable, then lost.
                for left in todo[todo.index(req) :]:
                    record.engines[left.engine] = EngineStatus(
                        engine=left.engine,
                        version=left.version,
                        state=EngineState.FAILED,
                        detail=f"install abandoned: the node stopped answering ({err})",
                    )
                await self._publish()
                return
            if status.state == EngineState.INSTALLED:
                status.verified_at = status.verified_at or self._now()
            record.engines[req.engine] = status
            await self._publish()

    async def _install(self, req: EngineRequirement) -> EngineStatus:
        """One engine's install, as a child workflow watched against this node's liveness: a
        machine that dies mid-build never answers, and must still be seen lost."""
        node = self._name()
        workflow_id = engine_install_workflow_id(node, req.engine, req.version)
        for attempt in range(1, INSTALL_RESTARTS + 1):
            install = workflow.execute_child_workflow(
                EngineInstallWorkflow.run,
                EngineInstallRequest(node=node, requirement=req),
                id=workflow_id,
            )
            workflow.deprecate_patch(INSTALL_WATCHES_LIVENESS)
            if not workflow.patched(INSTALL_RESTARTS_PATCH):
                return await self._while_heard(asyncio.ensure_future(install))
            try:
                return await self._while_heard(asyncio.ensure_future(install))
            except ChildWorkflowError as err:
                # The install's workflow ended without a result (terminated, cancelled): ask
                # again, and after a few in a row say so rather than wedge or fail the node.
                why = f"{workflow_id} ended without a result ({err.cause}), {attempt} time(s)"
                workflow.logger.warning("%s: %s", node, why)
        return EngineStatus(
            engine=req.engine,
            version=req.version,
            state=EngineState.FAILED,
            detail=f"install not finished: {why}; the agent's next registration tries again",
        )

    async def _take_inventory(self, inventory: NodeInventory) -> None:
        assert self.view is not None
        if inventory.name != self.view.record.inventory.name:
            return
        before = self.view.record.inventory
        if inventory.comparable() == before.comparable():
            return
        self.view.record.inventory = inventory
        gpus_changed = [g.uuid for g in inventory.gpus] != [g.uuid for g in before.gpus]
        if gpus_changed or inventory.nvidia_driver != before.nvidia_driver:
            await self._converge_engines()  # a GPU or driver appeared: another build may fit
        else:
            await self._publish()

    async def _refresh(self, asked: NodeRefresh) -> None:
        if self._state() not in (NodeState.READY, NodeState.REGISTERING):
            await self._publish()  # awaiting, unreachable and lost nodes have no agent to ask
            return
        assert self.view is not None
        queue = node_task_queue(self.view.record.inventory.name)
        try:
            if asked.inventory:
                inventory: NodeInventory = await self._while_heard(
                    start_discover(self.view.record.inventory.name, queue)
                )
                await self._take_inventory(inventory)
            if asked.engines:
                await self._reverify(queue)
        except ActivityError as err:
            workflow.logger.warning("refresh of %s failed: %s", queue, err.cause)
        except AgentSilent as err:
            workflow.logger.warning("refresh of %s given up: %s", queue, err)
        if not (asked.inventory or asked.engines):
            await self._publish()

    async def _reverify(self, queue: str) -> None:
        """Run every installed engine again: an unrelated upgrade can remove a library, and a
        later failure is reported (and keeps replicas away), not hidden."""
        assert self.view is not None
        engines = self.view.record.engines
        runnable = (EngineState.INSTALLED, EngineState.FAILED)
        checked = [s for s in engines.values() if s.state in runnable and s.path]
        if not checked:
            return
        result: VerifyEnginesResult = await self._while_heard(
            start_verify(self.view.record.inventory.name, queue, checked)
        )
        if take_verified(engines, result):
            await self._publish()

    # --- operator commands ----------------------------------------------------------------

    async def _command(self, name: str, cmd: NodeCommand) -> None:
        if self.view is None:
            return
        record = self.view.record
        if name == CORDON:
            record.cordoned, record.note = True, cmd.reason or "cordoned by operator"
            await self._publish()
        elif name == UNCORDON:
            record.cordoned, record.draining, record.note = False, False, ""
            self.view.draining_replicas = []
            await self._publish()
        elif name == DRAIN:
            record.cordoned, record.draining = True, True
            record.note = cmd.reason or "drained by operator"
            await self._publish()
            await self._move_replicas(record.note, wait_for_successor=True)
        elif name == REMOVE:
            record.cordoned, record.note = True, cmd.reason or "removed by operator"
            await self._set_state(NodeState.REMOVED, record.note)
            await self._move_replicas(f"node {record.inventory.name} removed", False)

    async def _follow_drain(self) -> None:
        """A drain is over when nothing is placed on the node any more."""
        assert self.view is not None
        left = await self._replicas_here()
        self.view.draining_replicas = sorted(r.replica_id for r in left.replicas)
        if not left.replicas:
            self.view.record.draining = False
            self.view.record.note = "drained"
            await self._publish()

    def _name(self) -> str:
        assert self.view is not None
        return self.view.record.inventory.name

    async def _move_replicas(self, reason: str, wait_for_successor: bool) -> None:
        """Ask each model with a replica here to start it elsewhere."""
        by_model: dict[str, list[str]] = {}
        for ref in (await self._replicas_here()).replicas:
            by_model.setdefault(ref.model, []).append(ref.replica_id)
        for model, replica_ids in sorted(by_model.items()):
            handle = workflow.get_external_workflow_handle(model_workflow_id(model))
            req = ReplaceReplicas(
                replica_ids=replica_ids, reason=reason, wait_for_successor=wait_for_successor
            )
            try:
                await handle.signal(ModelWorkflow.replace, req)
            except ApplicationError as err:  # the model was removed meanwhile
                workflow.logger.warning("could not move %s: %s", replica_ids, err)

    async def _replicas_here(self) -> ReplicaRefs:
        assert self.view is not None
        return await replicas_on(self.view.record.inventory.name)

    # --- state ------------------------------------------------------------------------------

    def _now(self) -> str:
        return workflow.now().isoformat(timespec="seconds")

    async def _set_state(self, state: NodeState, note: str = "") -> None:
        if self.view is None or self.view.record.state == state:
            return
        self.view.record.state = state
        if not self.view.record.cordoned:
            self.view.record.note = note
        await self._publish()

    async def _publish(self) -> None:
        assert self.view is not None
        self.last_published = True
        await upsert_node(self.view.record)
