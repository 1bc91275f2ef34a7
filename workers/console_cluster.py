"""The web console's view of the cluster for a gateway run by `llmgw gateway` or `llmgw up`: the
reads `llmgw nodes`, `llmgw models`, `llmgw fetches` and `llmgw top` make, and the node and
scale commands through the CLI's own code (workers/commands/node.py, workflows/model/client.py).
What the console shows is built by workers/console_data.py's pure functions."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from gateway.console.source import ConsoleRefused
from store.fleet import FleetTables
from workers.commands.node import NodeCommandRefused, send_node_command
from workers.console_data import ClusterReadings, cluster_view
from workers.fetch_progress import running_fetches
from workers.node_telemetry import read_agents
from workers.progress import install_progress, ledger_snapshot
from workflows.contracts import EngineState
from workflows.model.client import list_models, scale_model


def _why(err: BaseException) -> str:
    return str(err) or type(err).__name__


class TemporalClusterConsole:
    def __init__(self, client: Client, fleet: FleetTables, temporal_ui: str = "") -> None:
        self._client = client
        self._fleet = fleet
        self._temporal_ui = temporal_ui.rstrip("/")

    async def read(self) -> dict[str, Any]:
        client = self._client
        ledger = await ledger_snapshot(self._fleet)
        readings = ClusterReadings(ledger=ledger, temporal_ui=self._temporal_ui)
        urls = {name: r.inventory.metrics_url for name, r in ledger.nodes.items()}
        installing = [
            (name, s.engine, s.version)
            for name, record in ledger.nodes.items()
            for s in record.engines.values()
            if s.state == EngineState.INSTALLING
        ]
        telemetry, models, fetches, progress = await asyncio.gather(
            read_agents(urls),
            list_models(client),
            running_fetches(client),
            asyncio.gather(*(install_progress(client, *key) for key in installing)),
            return_exceptions=True,
        )
        # Each part that could not be read is said on the page; the rest is still shown.
        if isinstance(telemetry, BaseException):
            readings.problems.append(f"node agents: {_why(telemetry)}")
        else:
            readings.telemetry = telemetry
        if isinstance(models, BaseException):
            readings.problems.append(f"models: {_why(models)}")
        else:
            readings.models = models
        if isinstance(fetches, BaseException):
            readings.problems.append(f"fetches: {_why(fetches)}")
        else:
            readings.fetches = fetches
        if not isinstance(progress, BaseException):
            readings.install_progress = dict(zip(installing, progress, strict=True))
        return cluster_view(readings).model_dump(mode="json")

    async def node_command(self, node: str, action: str, reason: str) -> str:
        try:
            seen, here = await send_node_command(self._client, self._fleet, node, action, reason)
        except NodeCommandRefused as err:
            raise ConsoleRefused(str(err), status=404 if err.missing else 409) from None
        said = f"node {node}: {action} " + ("done" if seen else "sent")
        if action == "drain" and here:
            said += f"; moving {', '.join(here)}"
        return said

    async def scale(self, model: str, replicas: int) -> str:
        try:
            view = await scale_model(self._client, model, replicas)
        except WorkflowUpdateFailedError as err:
            raise ConsoleRefused(str(err.cause)) from None
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise ConsoleRefused(f"no model {model!r}", status=404) from None
            raise
        return f"model {view.spec.name}: {view.spec.replicas} replica(s) wanted"
