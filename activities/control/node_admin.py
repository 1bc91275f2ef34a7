"""Expecting a node before its agent arrives: used by `llmgw node add` and by the scheduled
onboarding workflow (through the ADD_NODE activity, since workflows cannot send updates)."""

from temporalio import activity
from temporalio.client import Client, WithStartWorkflowOperation, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy

from workflows.contracts import NodeAdd, NodeView
from workflows.names import CONTROL_TASK_QUEUE, ControlActivity, node_workflow_id
from workflows.node.workflow import NodeWorkflow


def node_handle(client: Client, name: str) -> WorkflowHandle[NodeWorkflow, NodeView | None]:
    """A node's workflow, typed: its signals, queries and updates go by method reference
    (`NodeWorkflow.drain`), which also gives their result types.

    Not get_workflow_handle_for(NodeWorkflow.run, ...): once a run method with an optional
    parameter (this one) went through that, mypy 2.4 infers Never for every later one with a
    required parameter (ModelWorkflow.run), in any module."""
    handle: WorkflowHandle[NodeWorkflow, NodeView | None] = client.get_workflow_handle(
        node_workflow_id(name)
    )
    return handle


async def add_node(client: Client, req: NodeAdd, task_queue: str = CONTROL_TASK_QUEUE) -> NodeView:
    """Start the node's workflow (on the control workers' `task_queue`) if it is new, then
    record its labels and identity."""
    start = WithStartWorkflowOperation(
        NodeWorkflow.run,
        id=node_workflow_id(req.name),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    return await client.execute_update_with_start_workflow(
        NodeWorkflow.add, req, start_workflow_operation=start
    )


class NodeAdminActivities:
    def __init__(self, client: Client) -> None:
        self.client = client

    @activity.defn(name=ControlActivity.ADD_NODE)
    async def add(self, req: NodeAdd) -> NodeView:
        # The queue this activity came from is the control queue of the workflow that asked.
        return await add_node(self.client, req, activity.info().task_queue)
