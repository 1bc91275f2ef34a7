"""`llmgw control`: the worker that runs every workflow and the ledger activities."""

import asyncio
import logging

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import Worker

from activities.ledger_calls import LedgerActivities
from workers.connect import connect_with_retry
from workers.paths import Locations
from workers.registry import CONTROL_WORKFLOWS
from workers.signals import stop_event
from workflows.contracts import LedgerState
from workflows.ledger import ClusterLedgerWorkflow
from workflows.names import CONTROL_TASK_QUEUE, LEDGER_WORKFLOW_ID

log = logging.getLogger("llmgw.control")


async def ensure_ledger(client: Client) -> None:
    """Start the cluster ledger if this is a new cluster; a no-op otherwise."""
    await client.start_workflow(
        ClusterLedgerWorkflow.run,
        LedgerState(),
        id=LEDGER_WORKFLOW_ID,
        task_queue=CONTROL_TASK_QUEUE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )


async def run_control(where: Locations) -> None:
    client = await connect_with_retry(where)
    await ensure_ledger(client)
    worker = Worker(
        client,
        task_queue=CONTROL_TASK_QUEUE,
        workflows=CONTROL_WORKFLOWS,
        activities=LedgerActivities(client).all(),
    )
    stop = stop_event()
    async with worker:
        log.info("control worker on %s (Temporal %s)", CONTROL_TASK_QUEUE, where.temporal)
        await stop.wait()


def main(where: Locations) -> None:
    asyncio.run(run_control(where))
