"""`llmgw control`: the worker that runs every workflow and the activities on the fleet tables."""

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from activities.control.artifact_fetches import ArtifactFetchActivities
from activities.control.engine_planning import ControlConfigActivities
from activities.control.fleet_activities import FleetActivities
from activities.control.model_load import ModelLoadActivities
from activities.control.node_admin import NodeAdminActivities
from activities.control.server_config import load_server_config
from activities.control.workflow_status import WorkflowStatusActivities
from store.fleet import FleetTables, open_fleet
from workers.connect import connect_with_retry
from workers.paths import Locations
from workers.registry import CONTROL_WORKFLOWS
from workers.schedules import ScheduleSettings, ensure_schedules
from workers.search_attributes import ensure_search_attributes
from workers.signals import stop_event
from workflows import otel
from workflows.names import CONTROL_TASK_QUEUE

log = logging.getLogger("llmgw.control")


def control_activities(
    client: Client, fleet: FleetTables, config_file: Path | None
) -> list[Callable[..., Any]]:
    return [
        *FleetActivities(fleet).all(),
        WorkflowStatusActivities(client).describe_workflows,
        ModelLoadActivities(fleet).model_load,
        *ControlConfigActivities(config_file).all(),
        NodeAdminActivities(client).add,
        *ArtifactFetchActivities(client).all(),
    ]


async def run_control(where: Locations, config_file: Path | None) -> None:
    # A broken configuration stops the worker here, with the field named, rather than failing
    # every node's engine plan later.
    config = load_server_config(config_file)
    # Before the client connects: its interceptor traces workflows when this is on.
    otel.start("llmgw-control")
    fleet = open_fleet(where.database_url, where.state_dir)
    await fleet.init()
    client = await connect_with_retry(where)
    await ensure_search_attributes(client)
    await ensure_schedules(
        client,
        ScheduleSettings(
            reverify_every=config.reverify_every,
            inventory_every=config.inventory_every,
            onboarding_every=config.onboarding_every,
            onboarding=config.nodes_file is not None,
            refresh=config.refresh_schedules,
        ),
    )
    worker = Worker(
        client,
        task_queue=CONTROL_TASK_QUEUE,
        workflows=CONTROL_WORKFLOWS,
        activities=control_activities(client, fleet, config_file),
    )
    stop = stop_event()
    try:
        async with worker:
            log.info("control worker on %s (Temporal %s)", CONTROL_TASK_QUEUE, where.temporal)
            await stop.wait()
    finally:
        await fleet.close()


def main(where: Locations, config_file: Path | None) -> None:
    asyncio.run(run_control(where, config_file))
