"""Model definitions through Temporal: create-or-update, scale, remove and list model workflows.
Used by the CLI, `llmgw up` and the gateway's admin API alike."""

from temporalio.client import Client, WithStartWorkflowOperation, WorkflowExecutionStatus
from temporalio.common import WorkflowIDConflictPolicy

from workflows.contracts import ModelSpec, ModelState, ModelView, RemoveModel, ScaleRequest
from workflows.model import ModelWorkflow
from workflows.names import CONTROL_TASK_QUEUE, model_workflow_id


def _start(spec: ModelSpec) -> WithStartWorkflowOperation[ModelWorkflow, ModelView]:
    return WithStartWorkflowOperation(
        ModelWorkflow.run,
        ModelState(spec=spec),
        id=model_workflow_id(spec.name),
        task_queue=CONTROL_TASK_QUEUE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )


async def apply_model(client: Client, spec: ModelSpec) -> ModelView:
    """Create the model if missing, then make its spec this one."""
    view: ModelView = await client.execute_update_with_start_workflow(
        "apply", spec, start_workflow_operation=_start(spec), result_type=ModelView
    )
    return view


async def define_if_missing(client: Client, spec: ModelSpec) -> bool:
    """Define the model only when no workflow runs for it, leaving an operator's changes alone."""
    if await describe_model(client, spec.name) is not None:
        return False
    await apply_model(client, spec)
    return True


async def describe_model(client: Client, name: str) -> ModelView | None:
    handle = client.get_workflow_handle(model_workflow_id(name))
    try:
        if (await handle.describe()).status != WorkflowExecutionStatus.RUNNING:
            return None
    except Exception:
        return None
    view: ModelView = await handle.query("describe", result_type=ModelView)
    return view


async def scale_model(client: Client, name: str, replicas: int) -> ModelView:
    handle = client.get_workflow_handle(model_workflow_id(name))
    view: ModelView = await handle.execute_update(
        "scale", ScaleRequest(replicas=replicas), result_type=ModelView
    )
    return view


async def remove_model(client: Client, name: str) -> ModelView:
    handle = client.get_workflow_handle(model_workflow_id(name))
    view: ModelView = await handle.execute_update("remove", RemoveModel(), result_type=ModelView)
    return view


async def list_models(client: Client) -> list[ModelView]:
    views = []
    query = "WorkflowType = 'Model' AND ExecutionStatus = 'Running'"
    async for execution in client.list_workflows(query):
        view = await describe_model(client, execution.id.removeprefix("model:"))
        if view is not None:
            views.append(view)
    return sorted(views, key=lambda v: v.spec.name)
