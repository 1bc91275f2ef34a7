"""Whether workflows still run, asked of Temporal by workflow ID: a model watches its replicas
this way, so it needs no child handle (none survives a continue-as-new) to notice one that an
operator terminated, or to know that a stopping one has let go of what it held."""

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from workflows.contracts import WorkflowIds, WorkflowStatuses
from workflows.names import ControlActivity


async def is_running(client: Client, workflow_id: str) -> bool:
    """True while a run of `workflow_id` is open; False when it closed (any way) or never
    existed. Any other failure is raised: silence proves nothing (DESIGN.md, "Faults and
    time"), so the caller retries rather than take a workflow for dead."""
    try:
        described = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return described.status == WorkflowExecutionStatus.RUNNING


class WorkflowStatusActivities:
    def __init__(self, client: Client) -> None:
        self.client = client

    @activity.defn(name=ControlActivity.DESCRIBE_WORKFLOWS)
    async def describe_workflows(self, ids: WorkflowIds) -> WorkflowStatuses:
        return WorkflowStatuses(
            running={wid: await is_running(self.client, wid) for wid in ids.workflow_ids}
        )
