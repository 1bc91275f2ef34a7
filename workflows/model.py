"""A model: its declared spec and how many replicas it should have.

Replicas are child workflows with deterministic IDs (replica:<model>:<index>); they are
abandoned rather than terminated if this workflow closes, and told to stop with a signal, so a
replica always gets to stop its engine and release what it holds.

Moving a replica (its node drains, is lost or removed) starts a successor first. A drained
replica keeps serving until its successor says it is ready; one on a lost node stops at once.
A rolling update is the same move, one replica at a time: when a replica reports a profile
fingerprint the catalog no longer has, a successor starts from the current definition and the
old one stops once the successor serves.

An external model (engine "external": servers llmgw does not run) has no replica workflows and
places nothing: this workflow publishes one ready route per URL to the ledger itself, replaces
them when the URLs change and withdraws them when the model is removed.
"""

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.workflow import ChildWorkflowHandle, ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.autoscale import decide
    from workflows.catalog import EXTERNAL, CatalogError, endpoint_base, validate_model
    from workflows.contracts import (
        EngineLoad,
        EngineLoadReport,
        EngineLoadRequest,
        LedgerAck,
        ModelIdle,
        ModelName,
        ModelSpec,
        ModelState,
        ModelView,
        ModelWake,
        RemoveModel,
        ReplaceReplicas,
        ReplicaInput,
        ReplicaReady,
        ReplicaState,
        ReplicaView,
        Route,
        RoutingTable,
        ScaleRequest,
        StopReplica,
    )
    from workflows.names import (
        CONTROL_TASK_QUEUE,
        EXTERNAL_NODE,
        ControlActivity,
        NodeActivity,
        external_replica_id,
        node_task_queue,
        replica_id,
        replica_workflow_id,
    )
    from workflows.replica import ReplicaWorkflow


@workflow.defn(name="Model")
class ModelWorkflow:
    @workflow.init
    def __init__(self, state: ModelState) -> None:
        self.state = state
        self.children: dict[int, ChildWorkflowHandle[ReplicaWorkflow, ReplicaView]] = {}
        self.replacements: list[ReplaceReplicas] = []
        self.ready_replicas: set[str] = set()
        # Replicas this run told to stop; removal waits for them to release what they hold.
        self.stopping: list[ChildWorkflowHandle[ReplicaWorkflow, ReplicaView]] = []
        self.published_idle: bool | None = None
        self.dirty = True

    @workflow.run
    async def run(self, state: ModelState) -> ModelView:
        while True:
            try:
                await workflow.wait_condition(lambda: self.dirty, timeout=self._next_look())
            except TimeoutError:
                await self._autoscale()
            self.dirty = False
            await self._replace()
            await self._retire_replaced()
            await self._reconcile()
            await self._roll()
            await self._publish_idle()
            await self._publish_external()
            if self.state.removing:
                # Wait for the replicas to release what they hold, so the name can be reused.
                for handle in self.stopping:
                    await handle
                return self._view()
            if workflow.info().is_continue_as_new_suggested():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(self.state)

    @workflow.update(name="apply")
    def apply(self, spec: ModelSpec) -> ModelView:
        self.state.spec = spec
        self.dirty = True
        return self._view()

    @apply.validator
    def _check_apply(self, spec: ModelSpec) -> None:
        self._check_not_removing()
        if spec.name != self.state.spec.name:
            raise ApplicationError(f"this is model {self.state.spec.name!r}, not {spec.name!r}")
        try:
            validate_model(spec)
        except CatalogError as err:
            raise ApplicationError(str(err), type="InvalidModel") from None

    @workflow.update(name="scale")
    def scale(self, req: ScaleRequest) -> ModelView:
        self.state.spec.replicas = req.replicas
        self.dirty = True
        return self._view()

    @scale.validator
    def _check_scale(self, req: ScaleRequest) -> None:
        self._check_not_removing()
        spec = self.state.spec
        if spec.external:
            raise ApplicationError(
                f"model {spec.name}: an external model has one replica per URL; change its "
                "URLs instead",
                type="InvalidModel",
            )
        if not spec.min_replicas <= req.replicas <= spec.max_replicas:
            raise ApplicationError(
                f"model {spec.name}: {req.replicas} replicas is outside min_replicas.."
                f"max_replicas ({spec.min_replicas}..{spec.max_replicas})",
                type="InvalidModel",
            )

    @workflow.update(name="remove")
    def remove(self, req: RemoveModel) -> ModelView:
        self.state.removing = True
        self.state.spec.replicas = 0
        self.dirty = True
        return self._view()

    @workflow.signal(name="replace")
    def replace(self, req: ReplaceReplicas) -> None:
        """Signalled by node workflows (drain, lost, removed): a fact about where replicas run."""
        self.replacements.append(req)
        self.dirty = True

    @workflow.signal(name="wake")
    def wake(self, req: ModelWake) -> None:
        """A gateway holds a request for this model at zero replicas (a fact, so a signal: the
        gateway does not wait on the workflow, it waits for a ready route)."""
        spec = self.state.spec
        if spec.replicas == 0 and spec.autoscale is not None and not self.state.removing:
            spec.replicas = max(1, spec.min_replicas)
            self.state.autoscale.last_active = workflow.now()
            self.dirty = True

    @workflow.signal(name="replica_ready")
    def replica_ready(self, ready: ReplicaReady) -> None:
        name = self.state.spec.name
        index = self._index_of(ready.replica_id)
        if index is not None and ready.fingerprint:
            self.state.fingerprints[index] = ready.fingerprint
            self.dirty = True
        if any(replica_id(name, s) == ready.replica_id for s in self.state.retiring.values()):
            self.ready_replicas.add(ready.replica_id)
            self.dirty = True

    @workflow.query(name="describe")
    def describe(self) -> ModelView:
        return self._view()

    def _check_not_removing(self) -> None:
        if self.state.removing:
            raise ApplicationError(f"model {self.state.spec.name!r} is being removed")

    def _view(self) -> ModelView:
        name = self.state.spec.name
        return ModelView(
            spec=self.state.spec,
            replica_ids=[replica_id(name, i) for i in self.state.indices]
            + list(self.state.external_routes),
            removing=self.state.removing,
            retiring=[replica_id(name, i) for i in self.state.retiring],
            stale=[replica_id(name, i) for i in self._stale()],
        )

    def _next_look(self) -> timedelta | None:
        policy = self.state.spec.autoscale
        if policy is None or self.state.removing or self.state.spec.external:
            return None
        return timedelta(seconds=policy.look_every_s)

    async def _autoscale(self) -> None:
        spec = self.state.spec
        if spec.autoscale is None or spec.external:
            return
        decision = decide(
            spec.autoscale,
            spec.replicas,
            spec.min_replicas,
            spec.max_replicas,
            self.state.autoscale,
            await self._engine_loads(),
            workflow.now(),
        )
        self.state.autoscale = decision.state
        if decision.replicas != spec.replicas:
            workflow.logger.info(
                "%s: %d -> %d replicas (%s)", spec.name, spec.replicas, decision.replicas,
                decision.reason,
            )  # fmt: skip
            spec.replicas = decision.replicas
            self.dirty = True

    async def _engine_loads(self) -> list[EngineLoad]:
        """Each serving replica's load, asked of the agent on its node (which holds the keys
        the engines' metrics want). A node that does not answer counts as unseen, not idle."""
        table: RoutingTable = await workflow.execute_activity(
            ControlActivity.LEDGER_MODEL_ROUTES,
            ModelName(name=self.state.spec.name),
            task_queue=CONTROL_TASK_QUEUE,
            start_to_close_timeout=options.LEDGER_CALL_TIMEOUT,
            retry_policy=options.LEDGER_RETRY,
            result_type=RoutingTable,
        )
        by_node: dict[str, list[str]] = {}
        for route in table.routes:
            if route.state in ReplicaState.routable():
                by_node.setdefault(route.node, []).append(route.replica_id)
        loads: list[EngineLoad] = []
        for node, replica_ids in sorted(by_node.items()):
            try:
                report: EngineLoadReport = await workflow.execute_activity(
                    NodeActivity.ENGINE_LOAD,
                    EngineLoadRequest(replica_ids=replica_ids),
                    task_queue=node_task_queue(node),
                    schedule_to_close_timeout=options.ENGINE_LOAD_TIMEOUT,
                    retry_policy=options.ENGINE_LOAD_RETRY,
                    result_type=EngineLoadReport,
                )
                loads.extend(report.engines)
            except ActivityError:
                loads.extend(EngineLoad(replica_id=r, seen=False) for r in replica_ids)
        return loads

    async def _publish_idle(self) -> None:
        """Tell the ledger (and so every gateway) whether a request should wake this model."""
        spec = self.state.spec
        idle = spec.autoscale is not None and spec.replicas == 0 and not self.state.removing
        if idle == self.published_idle:
            return
        await workflow.execute_activity(
            ControlActivity.LEDGER_SET_IDLE,
            ModelIdle(model=spec.name, idle=idle),
            task_queue=CONTROL_TASK_QUEUE,
            start_to_close_timeout=options.LEDGER_CALL_TIMEOUT,
            retry_policy=options.LEDGER_RETRY,
            result_type=LedgerAck,
        )
        self.published_idle = idle

    def _index_of(self, rid: str) -> int | None:
        name = self.state.spec.name
        return next((i for i in self.state.indices if replica_id(name, i) == rid), None)

    def _stale(self) -> list[int]:
        current = set(self.state.spec.fingerprints())
        known = self.state.fingerprints
        return [i for i in self.state.indices if i in known and known[i] not in current]

    async def _roll(self) -> None:
        """One stale replica at a time: wait until the last move is over before the next."""
        if self.state.retiring or self.state.removing or self.state.spec.external:
            return
        stale = self._stale()
        if stale:
            name = self.state.spec.name
            req = ReplaceReplicas(replica_ids=[replica_id(name, stale[0])], reason="rolling update")
            self.replacements.append(req)
            await self._replace()

    async def _start_replica(self) -> int:
        spec = self.state.spec
        index = self.state.next_index
        self.state.next_index += 1
        self.children[index] = await workflow.start_child_workflow(
            ReplicaWorkflow.run,
            ReplicaInput(replica_id=replica_id(spec.name, index), model=spec),
            id=replica_workflow_id(spec.name, index),
            task_queue=CONTROL_TASK_QUEUE,
            parent_close_policy=ParentClosePolicy.ABANDON,
        )
        self.state.indices.append(index)
        return index

    async def _stop_replica(self, index: int, request: StopReplica) -> None:
        handle = workflow.get_external_workflow_handle(
            replica_workflow_id(self.state.spec.name, index)
        )
        await handle.signal("stop", request)
        if index in self.children:
            self.stopping.append(self.children.pop(index))

    async def _replace(self) -> None:
        """Start a successor for each replica asked to move; the old one stops now or later."""
        name = self.state.spec.name
        while self.replacements:
            req = self.replacements.pop(0)
            for rid in req.replica_ids:
                old = self._index_of(rid)
                if old is None:
                    # Already moved, or retiring: a lost node overrides a drain's patience.
                    retiring = [i for i in self.state.retiring if replica_id(name, i) == rid]
                    for index in retiring if not req.wait_for_successor else []:
                        del self.state.retiring[index]
                        await self._stop_replica(index, self._moved(req))
                    continue
                self.state.indices.remove(old)
                self.state.fingerprints.pop(old, None)
                successor = await self._start_replica()
                if req.wait_for_successor and not self.state.removing:
                    self.state.retiring[old] = successor
                else:
                    await self._stop_replica(old, self._moved(req))

    @staticmethod
    def _moved(req: ReplaceReplicas) -> StopReplica:
        return StopReplica(reason=req.reason, engine_gone=not req.wait_for_successor)

    async def _retire_replaced(self) -> None:
        """Stop each replaced replica whose successor serves, or is itself gone."""
        name = self.state.spec.name
        for old, successor in list(self.state.retiring.items()):
            successor_id = replica_id(name, successor)
            gone = successor not in self.state.indices
            if successor_id in self.ready_replicas or gone or self.state.removing:
                del self.state.retiring[old]
                self.ready_replicas.discard(successor_id)
                reason = f"moved to {successor_id}" if not gone else "replaced"
                await self._stop_replica(old, StopReplica(reason=reason))

    async def _reconcile(self) -> None:
        """Start or stop replicas until their count matches the spec."""
        spec = self.state.spec
        # An external model's replicas are its URLs: it runs none of its own (and stops any it
        # ran before its definition turned external).
        wanted = 0 if spec.external else spec.replicas
        while len(self.state.indices) < wanted:
            await self._start_replica()
        while len(self.state.indices) > wanted:
            index = self.state.indices.pop()  # newest first
            reason = "model removed" if self.state.removing else "scaled down"
            await self._stop_replica(index, StopReplica(reason=reason))

    async def _publish_external(self) -> None:
        """One ready route per URL of an external model, through the ledger update replicas
        use; a URL no longer listed (or every URL, once removed or no longer external) has its
        route withdrawn. A URL keeps its replica id while it stays listed, and every route is
        published again on each pass, so a changed definition reaches its fingerprint."""
        spec = self.state.spec
        published = self.state.external_routes
        wanted: list[str] = []
        if spec.external and not self.state.removing:
            wanted = [endpoint_base(url) for url in spec.profiles[0].urls]
        if not wanted and not published:
            return
        ids = {endpoint: rid for rid, endpoint in published.items()}
        routes: dict[str, str] = {}
        for endpoint in wanted:
            rid = ids.get(endpoint)
            if rid is None:
                rid = external_replica_id(spec.name, self.state.next_index)
                self.state.next_index += 1
            routes[rid] = endpoint
        fingerprint = spec.profile_fingerprint(0) if spec.external else ""
        # Add before withdrawing, so a gateway never sees the model with no route mid-change.
        await asyncio.gather(
            *(
                self._set_route(rid, endpoint, ReplicaState.READY, fingerprint)
                for rid, endpoint in routes.items()
            )
        )
        self.state.external_routes = routes
        await asyncio.gather(
            *(
                self._set_route(rid, endpoint, ReplicaState.STOPPED, fingerprint)
                for rid, endpoint in published.items()
                if rid not in routes
            )
        )

    async def _set_route(
        self, rid: str, endpoint: str, state: ReplicaState, fingerprint: str
    ) -> None:
        route = Route(
            replica_id=rid,
            model=self.state.spec.name,
            node=EXTERNAL_NODE,
            endpoint=endpoint,
            engine=EXTERNAL,
            state=state,
            fingerprint=fingerprint,
            detail="external endpoint",
            upstream_model=self.state.spec.profiles[0].upstream_model,
        )
        await workflow.execute_activity(
            ControlActivity.LEDGER_SET_ROUTE,
            route,
            task_queue=CONTROL_TASK_QUEUE,
            start_to_close_timeout=options.LEDGER_CALL_TIMEOUT,
            retry_policy=options.LEDGER_RETRY,
            result_type=LedgerAck,
        )
