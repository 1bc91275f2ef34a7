"""The model workflow as its clients see it: its type name and the signatures of the messages
they send, without its code.

The CLI, the admin API and the gateway start, update, signal and query model workflows through
typed handles (`handle.execute_update(ModelApi.scale, ...)`), which need only these names and
types. Importing workflows/model/workflow.py for them loaded the whole control plane (the replica
workflow, placement, the catalog) into every gateway: this class is what they import instead.
It is never registered with a worker; tests/unit/test_model_api.py holds it to ModelWorkflow,
name by name and type by type.
"""

from temporalio import workflow

from workflows.contracts import (
    ModelSpec,
    ModelState,
    ModelView,
    ModelWake,
    RemoveModel,
    ReplaceReplicas,
    ScaleRequest,
)


def _client_side_only() -> NotImplementedError:
    return NotImplementedError("ModelApi is a client's view of ModelWorkflow: register that")


@workflow.defn(name="Model")
class ModelApi:
    @workflow.run
    async def run(self, state: ModelState) -> ModelView:
        raise _client_side_only()

    @workflow.update(name="apply")
    def apply(self, spec: ModelSpec) -> ModelView:
        raise _client_side_only()

    @workflow.update(name="scale")
    def scale(self, req: ScaleRequest) -> ModelView:
        raise _client_side_only()

    @workflow.update(name="remove")
    def remove(self, req: RemoveModel) -> ModelView:
        raise _client_side_only()

    @workflow.signal(name="replace")
    def replace(self, req: ReplaceReplicas) -> None:
        raise _client_side_only()

    @workflow.signal(name="wake")
    def wake(self, req: ModelWake) -> None:
        raise _client_side_only()

    @workflow.query(name="describe")
    def describe(self) -> ModelView:
        raise _client_side_only()
