"""A model: its declared spec and how many replicas it should have.

Replicas are child workflows with deterministic IDs (replica:<model>:<index>); they are
abandoned rather than terminated if this workflow closes, and told to stop with a signal, so a
replica always gets to stop its engine and release what it holds.
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
        ReplicaInput,
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
        self.dirty = True

    @workflow.run
    async def run(self, state: ModelState) -> ModelView:
        while True:
            await workflow.wait_condition(lambda: self.dirty)
            self.dirty = False
            stopping = await self._reconcile()
            if self.state.removing:
                # Wait for the replicas to release what they hold, so the name can be reused.
                for handle in stopping:
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
        )

    async def _reconcile(self) -> list[ChildWorkflowHandle[ReplicaWorkflow, ReplicaView]]:
        """Start or stop replicas until their count matches the spec; returns the handles of the
        replicas told to stop (those this run started)."""
        spec = self.state.spec
        while len(self.state.indices) < spec.replicas:
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
        stopping: list[ChildWorkflowHandle[ReplicaWorkflow, ReplicaView]] = []
        while len(self.state.indices) > spec.replicas:
            index = self.state.indices.pop()  # newest first
            reason = "model removed" if self.state.removing else "scaled down"
            await workflow.get_external_workflow_handle(
                replica_workflow_id(spec.name, index)
            ).signal("stop", StopReplica(reason=reason))
            if index in self.children:
                stopping.append(self.children.pop(index))
        return stopping
