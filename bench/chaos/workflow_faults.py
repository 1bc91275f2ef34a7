"""What an operator can do to a workflow in one click of the Temporal UI or one CLI command:
terminate it, cancel it, or reset it to its first workflow task (`temporal workflow reset
--type FirstWorkflowTask`). A model's workflow, once terminated, is applied again, as
docs/operations.md tells an operator to: a model's definition lives in its workflow.
"""

import random
import uuid

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client

from bench.chaos.checks import ready_replicas
from bench.chaos.inject import NoVictim
from bench.chaos.plan import CANCEL, RESET, TERMINATE
from workflows.contracts import LedgerState
from workflows.names import model_workflow_id, node_workflow_id, replica_workflow_id

REASON = "make chaos"


def victim(target: str, node: str, model: str, ledger: LedgerState, rng: random.Random) -> str:
    """The workflow ID a round hits: the node's, a ready replica's, or the model's."""
    if target == "node-workflow":
        return node_workflow_id(node)
    if target == "model-workflow":
        return model_workflow_id(model)
    ready = ready_replicas(ledger, model)
    if not ready:
        raise NoVictim("no ready replica to hit")
    return replica_workflow_id(model, int(rng.choice(ready).removeprefix(f"{model}-")))


async def reset_to_first_task(client: Client, workflow_id: str) -> None:
    handle = client.get_workflow_handle(workflow_id)
    events = (await handle.fetch_history()).events
    first = next(
        e.event_id for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    )
    run_id = (await handle.describe()).run_id
    await client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id),
            reason=REASON,
            workflow_task_finish_event_id=first,
            request_id=str(uuid.uuid4()),
        )
    )


async def hit(client: Client, workflow_id: str, action: str) -> None:
    handle = client.get_workflow_handle(workflow_id)
    if action == TERMINATE:
        await handle.terminate(REASON)
    elif action == CANCEL:
        await handle.cancel()
    elif action == RESET:
        await reset_to_first_task(client, workflow_id)
    else:
        raise ValueError(f"{action} is not done to a workflow")
