"""`llmgw control`: the worker that runs every workflow and the ledger activities."""

import asyncio
import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.worker import Worker

from activities.control.artifact_fetches import ArtifactFetchActivities
from activities.control.engine_planning import ControlConfigActivities
from activities.control.ledger_calls import ledger_cells, start_ledger
from activities.control.ledger_cluster import LedgerActivities
from activities.control.node_admin import NodeAdminActivities
from activities.control.server_config import load_server_config
from activities.control.workflow_status import WorkflowStatusActivities
from workers import gc_policy
from workers.connect import connect_with_retry
from workers.paths import Locations
from workers.registry import CONTROL_WORKFLOWS
from workers.schedules import ScheduleSettings, ensure_schedules
from workers.search_attributes import ensure_search_attributes
from workers.signals import stop_event
from workers.stuck_runs import exit_when_a_run_is_stuck
from workflows.names import CONTROL_TASK_QUEUE, ledger_cell_workflow_id

log = logging.getLogger("llmgw.control")

CELLS_QUERY_TIMEOUT_S = 10


async def ensure_ledger(client: Client) -> None:
    """Start the cluster ledger if this is a new cluster; a no-op otherwise. A closed ledger is
    not replaced by an empty one (that would double-book every device): the worker runs on, and
    says what to do, until `llmgw ledger rebuild`."""
    try:
        await start_ledger(client)
    except ApplicationError as err:
        log.error(err.message)


def control_activities(client: Client, config_file: Path | None) -> list[Callable[..., Any]]:
    return [
        *LedgerActivities(client).all(),
        WorkflowStatusActivities(client).describe_workflows,
        *ControlConfigActivities(config_file).all(),
        NodeAdminActivities(client).add,
        ArtifactFetchActivities(client).await_fetch,
    ]


async def run_control(where: Locations, config_file: Path | None) -> None:
    # A broken configuration stops the worker here, with the field named, rather than failing
    # every node's engine plan later.
    config = load_server_config(config_file)
    gc_policy.for_large_state()
    client = await connect_with_retry(where)
    await ensure_search_attributes(client)
    await ensure_ledger(client)
    await ensure_schedules(
        client,
        ScheduleSettings(
            reverify_every=config.reverify_every,
            inventory_every=config.inventory_every,
            onboarding_every=config.onboarding_every,
            onboarding=config.nodes_file is not None,
        ),
    )
    worker = Worker(
        client,
        task_queue=CONTROL_TASK_QUEUE,
        workflows=CONTROL_WORKFLOWS,
        activities=control_activities(client, config_file),
    )
    stop = stop_event()
    async with worker:
        log.info("control worker on %s (Temporal %s)", CONTROL_TASK_QUEUE, where.temporal)
        # Ends the process itself (workers/stuck_runs.py), so it is only ever cancelled here.
        watch = asyncio.create_task(exit_when_a_run_is_stuck(client, partial(ledger_ids, client)))
        try:
            await stop.wait()
        finally:
            watch.cancel()


async def ledger_ids(client: Client) -> list[str]:
    """Every ledger cell's workflow id. The count is a query to cell 0, which a stuck cell 0
    would never answer: cell 0 alone is watched until the count is known."""
    try:
        async with asyncio.timeout(CELLS_QUERY_TIMEOUT_S):
            cells = await ledger_cells(client)
    except (RPCError, TimeoutError):
        cells = 1
    return [ledger_cell_workflow_id(cell) for cell in range(cells)]


def main(where: Locations, config_file: Path | None) -> None:
    asyncio.run(run_control(where, config_file))
