"""Expecting a node before its agent arrives: used by `llmgw node add` and by the scheduled
onboarding workflow (through the ADD_NODE activity, since workflows cannot send updates)."""

from temporalio import activity
from temporalio.client import Client, WithStartWorkflowOperation
from temporalio.common import WorkflowIDConflictPolicy

from workflows.contracts import NodeAdd, NodeView
from workflows.names import CONTROL_TASK_QUEUE, ControlActivity, node_workflow_id
from workflows.node import NodeWorkflow


async def add_node(client: Client, req: NodeAdd) -> NodeView:
    """Start the node's workflow if it is new, then record its labels and identity."""
    start = WithStartWorkflowOperation(
        NodeWorkflow.run,
        id=node_workflow_id(req.name),
        task_queue=CONTROL_TASK_QUEUE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    view: NodeView = await client.execute_update_with_start_workflow(
        NodeWorkflow.add, req, start_workflow_operation=start
    )
    return view


class NodeAdminActivities:
    def __init__(self, client: Client) -> None:
        self.client = client

    @activity.defn(name=ControlActivity.ADD_NODE)
    async def add(self, req: NodeAdd) -> NodeView:
        return await add_node(self.client, req)
