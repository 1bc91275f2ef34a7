"""A model: its declared spec and how many replicas it should have.

Replicas are child workflows with deterministic IDs (replica:<model>:<index>); they are
abandoned rather than terminated if this workflow closes, and told to stop with a signal, so a
replica always gets to stop its engine and release what it holds.

Moving a replica (its node drains, is lost or removed) starts a successor first. A drained
replica keeps serving until its successor says it is ready; one on a lost node stops at once.
"""

from temporalio import workflow
from temporalio.exceptions import ApplicationError
from temporalio.workflow import ChildWorkflowHandle, ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from workflows.contracts import (
        ModelSpec,
        ModelState,
        ModelView,
        RemoveModel,
        ReplaceReplicas,
        ReplicaInput,
        ReplicaReady,
        ReplicaView,
        ScaleRequest,
        StopReplica,
    )
    from workflows.names import CONTROL_TASK_QUEUE, replica_id, replica_workflow_id
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
        self.dirty = True

    @workflow.run
    async def run(self, state: ModelState) -> ModelView:
        while True:
            await workflow.wait_condition(lambda: self.dirty)
            self.dirty = False
            await self._replace()
            await self._retire_replaced()
            await self._reconcile()
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

    @workflow.update(name="scale")
    def scale(self, req: ScaleRequest) -> ModelView:
        self.state.spec.replicas = req.replicas
        self.dirty = True
        return self._view()

    @scale.validator
    def _check_scale(self, req: ScaleRequest) -> None:
        self._check_not_removing()

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

    @workflow.signal(name="replica_ready")
    def replica_ready(self, ready: ReplicaReady) -> None:
        name = self.state.spec.name
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
            replica_ids=[replica_id(name, i) for i in self.state.indices],
            removing=self.state.removing,
            retiring=[replica_id(name, i) for i in self.state.retiring],
        )

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
                old = next((i for i in self.state.indices if replica_id(name, i) == rid), None)
                if old is None:
                    # Already moved, or retiring: a lost node overrides a drain's patience.
                    retiring = [i for i in self.state.retiring if replica_id(name, i) == rid]
                    for index in retiring if not req.wait_for_successor else []:
                        del self.state.retiring[index]
                        await self._stop_replica(index, self._moved(req))
                    continue
                self.state.indices.remove(old)
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
        while len(self.state.indices) < spec.replicas:
            await self._start_replica()
        while len(self.state.indices) > spec.replicas:
            index = self.state.indices.pop()  # newest first
            reason = "model removed" if self.state.removing else "scaled down"
            await self._stop_replica(index, StopReplica(reason=reason))
