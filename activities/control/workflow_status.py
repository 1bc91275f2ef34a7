"""Whether workflows still run, asked of Temporal by workflow ID: a model watches its replicas
this way, so it needs no child handle (none survives a continue-as-new) to notice one that an
operator terminated, or to know that a stopping one has let go of what it held."""

import asyncio

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from workflows.contracts import WorkflowIds, WorkflowStatuses
from workflows.contracts.ledger import NOT_FOUND
from workflows.names import ControlActivity

# Describe calls in flight at once, per activity.
DESCRIBES_AT_ONCE = 32


async def closed_how(client: Client, workflow_id: str) -> str | None:
    """None while a run of `workflow_id` is open; else how its latest run ended, in
    WorkflowStatuses.closed's words ("not_found" when there is none). Any other failure is
    raised: silence proves nothing (docs/operations.md, "Terminate, cancel and reset"), so the
    caller retries rather than take a workflow for dead."""
    try:
        described = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return NOT_FOUND
        raise
    status = described.status
    if status is None or status == WorkflowExecutionStatus.RUNNING:
        return None
    return status.name.lower()


class WorkflowStatusActivities:
    def __init__(self, client: Client) -> None:
        self.client = client

    @activity.defn(name=ControlActivity.DESCRIBE_WORKFLOWS)
    async def describe_workflows(self, ids: WorkflowIds) -> WorkflowStatuses:
        """DESCRIBES_AT_ONCE at a time: a model's check of 1,000 replicas (its batch,
        workflows/options.py REPLICA_CHECK_BATCH) takes a fraction of a second, not 1,000
        round trips one after another. One failure fails the whole answer (and cancels the
        rest): a partial answer would read as "running" for the ones not asked."""
        gate = asyncio.Semaphore(DESCRIBES_AT_ONCE)

        async def one(wid: str) -> str | None:
            async with gate:
                return await closed_how(self.client, wid)

        try:
            async with asyncio.TaskGroup() as group:
                tasks = {
                    wid: group.create_task(one(wid)) for wid in dict.fromkeys(ids.workflow_ids)
                }
        except ExceptionGroup as failed:
            raise failed.exceptions[0] from None  # the first failure, as the activity's error
        closed = {wid: task.result() for wid, task in tasks.items()}
        return WorkflowStatuses(
            running={wid: how is None for wid, how in closed.items()},
            closed={wid: how for wid, how in closed.items() if how is not None},
        )
