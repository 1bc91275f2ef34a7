"""The web console's view of the cluster for a gateway run by `llmgw gateway` or `llmgw up`: the
reads `llmgw nodes`, `llmgw models`, `llmgw fetches` and `llmgw top` make, and the node and
scale commands through the CLI's own code (workers/commands/node.py, workflows/model/client.py).
What the console shows is built by workers/console_data.py's pure functions. Where the gateway
runs on the control plane's machine (`llmgw up`), the mirror is read from its state dir as
`llmgw mirror ls` reads it, and imports from Ollama run here (workers/console_import.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from activities.control.mirror.store import MirrorStore
from gateway.console.source import ConsoleRefused
from store.fleet import FleetTables
from workers.commands.mirror import MirrorEntry, mirror_entries
from workers.commands.node import NodeCommandRefused, send_node_command
from workers.console_data import ClusterReadings, cluster_view
from workers.console_import import OllamaImports
from workers.fetch_progress import running_fetches
from workers.node_telemetry import read_agents
from workers.paths import Locations
from workers.progress import install_progress, ledger_snapshot
from workflows.contracts import EngineState, ModelSpec
from workflows.model.client import apply_model, list_models, scale_model


def _why(err: BaseException) -> str:
    return str(err) or type(err).__name__


def read_mirror(mirror_dir: Path) -> list[MirrorEntry] | None:
    """`llmgw mirror ls`' names, or None where no mirror was ever made on this machine."""
    if not mirror_dir.is_dir():
        return None
    return mirror_entries(MirrorStore(mirror_dir))


class TemporalClusterConsole:
    def __init__(
        self,
        client: Client,
        fleet: FleetTables,
        temporal_ui: str = "",
        where: Locations | None = None,
        ollama_store: str | None = None,  # None: $OLLAMA_MODELS or ~/.ollama/models
    ) -> None:
        self._client = client
        self._fleet = fleet
        self._temporal_ui = temporal_ui.rstrip("/")
        self._where = where
        # Also `llmgw top`'s, so its `i` imports as the console's form does.
        self.imports = (
            OllamaImports(
                where.models_dir, where.mirror_dir, self._apply, self._defined, ollama_store
            )
            if where is not None
            else None
        )

    async def _apply(self, spec: ModelSpec) -> None:
        await apply_model(self._client, spec)

    async def _defined(self) -> set[str]:
        return {view.spec.name for view in await list_models(self._client)}

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
        mirror_dir = self._where.mirror_dir if self._where is not None else None
        telemetry, models, fetches, progress, mirror = await asyncio.gather(
            read_agents(urls),
            list_models(client),
            running_fetches(client),
            asyncio.gather(*(install_progress(client, *key) for key in installing)),
            asyncio.to_thread(read_mirror, mirror_dir) if mirror_dir else asyncio.sleep(0),
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
        if isinstance(mirror, BaseException):
            readings.problems.append(f"the mirror: {_why(mirror)}")
        else:
            readings.mirror = mirror
        if self.imports is not None:
            readings.imports = self.imports.views()
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

    async def import_ollama(self, reference: str, name: str, mirror: bool) -> str:
        if self.imports is None:
            raise ConsoleRefused("this gateway has no state dir to import into", status=404)
        return await self.imports.start(reference, name, mirror)
