"""Control-plane activities that read the server configuration: the engine plan for a node,
and the operator's nodes file. Registered by the control worker on CONTROL_TASK_QUEUE.

The file is read again on every call, so an edit (a new engine version, a node disabled)
applies at the next registration or re-verification without restarting anything. A broken
file fails the activity with the field named, and Temporal retries it until it is fixed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.control.server_config import ConfigError, load_nodes_file, load_server_config
from workflows.contracts import EnginePlan, EnginePlanRequest, NodesFile, NodesFileRequest
from workflows.engine_plan import plan_engines
from workflows.names import ControlActivity


class ControlConfigActivities:
    def __init__(self, config_path: Path | None) -> None:
        self._config_path = config_path

    def all(self) -> list[Callable[..., Awaitable[object]]]:
        return [self.engine_plan, self.read_nodes_file]

    @activity.defn(name=ControlActivity.ENGINE_PLAN)
    async def engine_plan(self, req: EnginePlanRequest) -> EnginePlan:
        try:
            config = await asyncio.to_thread(load_server_config, self._config_path)
        except ConfigError as err:
            # Retryable on purpose: the operator fixes the file, the next attempt reads it.
            raise ApplicationError(str(err), type="ConfigError") from err
        return plan_engines(config.engines, req)

    @activity.defn(name=ControlActivity.READ_NODES_FILE)
    async def read_nodes_file(self, _req: NodesFileRequest | None = None) -> NodesFile:
        try:
            config = await asyncio.to_thread(load_server_config, self._config_path)
            if config.nodes_file is None:
                return NodesFile()
            nodes = await asyncio.to_thread(load_nodes_file, config.nodes_file)
        except ConfigError as err:
            raise ApplicationError(str(err), type="ConfigError") from err
        return NodesFile(source=str(config.nodes_file), nodes=nodes)
