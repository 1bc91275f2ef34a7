"""Model definitions through Temporal: create-or-update, scale, remove and list model workflows.
Used by the CLI, `llmgw up` and the gateway's admin API alike."""

from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowExecutionStatus,
    WorkflowHandle,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError

from workflows.contracts import ModelSpec, ModelState, ModelView, RemoveModel, ScaleRequest
from workflows.model.api import ModelApi
from workflows.names import CONTROL_TASK_QUEUE, model_workflow_id


def model_handle(client: Client, name: str) -> WorkflowHandle[ModelApi, ModelView]:
    """A model's workflow, typed: its signals, queries and updates go by method reference
    (`ModelApi.scale`), which also gives their result types.

    Not get_workflow_handle_for(ModelApi.run, ...): mypy 2.4 infers Never for it once a run
    method with an optional parameter (NodeWorkflow.run) went through it first, in any module."""
    handle: WorkflowHandle[ModelApi, ModelView] = client.get_workflow_handle(
        model_workflow_id(name)
    )
    return handle


def _start(spec: ModelSpec, task_queue: str) -> WithStartWorkflowOperation[ModelApi, ModelView]:
    return WithStartWorkflowOperation(
        ModelApi.run,
        ModelState(spec=spec),
        id=model_workflow_id(spec.name),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )


async def apply_model(
    client: Client, spec: ModelSpec, task_queue: str = CONTROL_TASK_QUEUE
) -> ModelView:
    """Create the model if missing, then make its spec this one. `task_queue`: the control
    workers' queue, where a new model's workflow (and so its replicas) runs."""
    return await client.execute_update_with_start_workflow(
        ModelApi.apply, spec, start_workflow_operation=_start(spec, task_queue)
    )


async def define_if_missing(client: Client, spec: ModelSpec) -> bool:
    """Define the model only when no workflow runs for it, leaving an operator's changes alone."""
    if await describe_model(client, spec.name) is not None:
        return False
    await apply_model(client, spec)
    return True


async def describe_model(client: Client, name: str) -> ModelView | None:
    handle = model_handle(client, name)
    try:
        if (await handle.describe()).status != WorkflowExecutionStatus.RUNNING:
            return None
    except RPCError:  # no such workflow, or Temporal unreachable: no model to describe
        return None
    return await handle.query(ModelApi.describe)


async def scale_model(client: Client, name: str, replicas: int) -> ModelView:
    return await model_handle(client, name).execute_update(
        ModelApi.scale, ScaleRequest(replicas=replicas)
    )


async def remove_model(client: Client, name: str) -> ModelView:
    return await model_handle(client, name).execute_update(ModelApi.remove, RemoveModel())


async def list_models(client: Client) -> list[ModelView]:
    views = []
    query = "WorkflowType = 'Model' AND ExecutionStatus = 'Running'"
    async for execution in client.list_workflows(query):
        view = await describe_model(client, execution.id.removeprefix("model:"))
        if view is not None:
            views.append(view)
    return sorted(views, key=lambda v: v.spec.name)
