"""Where `llmgw top` reads from: the cluster ledger's snapshot through Temporal (nodes,
replicas), each node agent's /metrics (GPUs now, engines' load; workers/node_telemetry.py)
and the gateway's admin listener on loopback (its counters and fair queue on /metrics, keys
and usage); for the Models and Mirror panes, the catalog through Temporal (as `llmgw model
list`), the nodes' fetches in progress (as `llmgw fetches`) and the mirror's files in the state
dir (as `llmgw mirror ls`). What cannot be read becomes a line in `TopData.problems`; the rest
is still shown.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import httpx
from prometheus_client.parser import text_string_to_metric_families
from temporalio.client import Client

from activities.control.mirror.store import MirrorStore
from store.fleet import FleetTables
from workers.commands.mirror import artifacts_used, mirror_entries
from workers.fetch_progress import running_fetches
from workers.node_telemetry import read_agents
from workers.progress import ledger_snapshot
from workers.top.catalog import artifact_rows, fetch_rows, model_rows
from workers.top.data import (
    TopData,
    cluster_rows,
    counters_from_samples,
    key_quotas,
    queue_from_samples,
)
from workflows.contracts import Route
from workflows.model.client import list_models

# Each read is bounded, so a refresh never hangs on a frozen server.
LEDGER_TIMEOUT_S = 5.0
ADMIN_TIMEOUT_S = 2.0


class TopSource(Protocol):
    async def read(self) -> TopData: ...


def _why(err: BaseException) -> str:
    return str(err) or type(err).__name__


class CatalogReader:
    """The models, the fetches in progress and the mirror in the state dir, read into a
    `TopData` the ledger's snapshot has filled (its routes give the ready replicas)."""

    def __init__(self, client: Client, mirror_dir: Path) -> None:
        self._client = client
        self._mirror_dir = mirror_dir

    async def read(self, data: TopData, routes: list[Route]) -> None:
        views, fetches = await asyncio.gather(
            asyncio.wait_for(list_models(self._client), LEDGER_TIMEOUT_S),
            asyncio.wait_for(running_fetches(self._client), LEDGER_TIMEOUT_S),
            return_exceptions=True,
        )
        if isinstance(views, BaseException):
            data.problems.append(f"models: {_why(views)}")
            views = []
        else:
            data.catalog = model_rows(views, routes)
        if isinstance(fetches, BaseException):
            data.problems.append(f"fetches: {_why(fetches)}")
        else:
            data.fetches = fetch_rows(fetches)
        data.mirror_dir = str(self._mirror_dir)
        if not self._mirror_dir.is_dir():
            return  # nothing added yet, or the control plane's state dir is on another machine
        try:
            entries = await asyncio.to_thread(mirror_entries, MirrorStore(self._mirror_dir))
        except OSError as err:
            data.problems.append(f"mirror at {self._mirror_dir}: {_why(err)}")
            return
        data.mirror = artifact_rows(entries, artifacts_used(views))


class LiveSource:
    def __init__(
        self,
        client: Client,
        fleet: FleetTables,
        admin_url: str,
        catalog: CatalogReader | None = None,
    ) -> None:
        self._client = client
        self._fleet = fleet
        self._admin = admin_url.rstrip("/")
        self._catalog = catalog
        self._last: TopData | None = None

    async def read(self) -> TopData:
        problems: list[str] = []
        taken_at = time.monotonic()
        routes: list[Route] = []
        try:
            ledger = await asyncio.wait_for(ledger_snapshot(self._fleet), LEDGER_TIMEOUT_S)
        except Exception as err:  # noqa: BLE001 - shown on screen; the console keeps going
            problems.append(f"store: {_why(err)}")
            nodes, replicas = (self._last.nodes, self._last.replicas) if self._last else ([], [])
        else:
            urls = {name: r.inventory.metrics_url for name, r in ledger.nodes.items()}
            nodes, replicas = cluster_rows(ledger, await read_agents(urls))
            routes = list(ledger.routes.values())
        data = TopData(taken_at=taken_at, nodes=nodes, replicas=replicas, problems=problems)
        if self._catalog is not None:
            await self._catalog.read(data, routes)
        # The admin API refuses requests through a proxy's address (loopback only).
        async with httpx.AsyncClient(trust_env=False, timeout=ADMIN_TIMEOUT_S) as http:
            await self._gateway(http, data)
        self._last = data
        return data

    async def _gateway(self, http: httpx.AsyncClient, data: TopData) -> None:
        today = datetime.now(UTC).date()
        try:
            metrics, keys, usage = await asyncio.gather(
                http.get(f"{self._admin}/metrics"),
                http.get(f"{self._admin}/admin/v1/keys"),
                http.get(
                    f"{self._admin}/admin/v1/usage",
                    params={"since": today.replace(day=1).isoformat()},
                ),
            )
            for response in (metrics, keys, usage):
                response.raise_for_status()
            samples = [
                (s.name, dict(s.labels), s.value)
                for family in text_string_to_metric_families(metrics.text)
                for s in family.samples
            ]
            key_list: list[dict[str, Any]] = keys.json()["data"]
            usage_rows: list[dict[str, Any]] = usage.json()["data"]
        except (httpx.HTTPError, ValueError, KeyError) as err:
            data.problems.append(f"gateway admin API at {self._admin}: {_why(err)}")
            return
        data.models, data.in_flight = counters_from_samples(samples)
        data.waiting, data.replica_depths = queue_from_samples(samples)
        data.keys = key_quotas(key_list, usage_rows, today)


class FileSource:
    """A `TopData` kept in a JSON file, read again at every refresh: the stand-in the console's
    tests drive (they change the file and watch the screen follow)."""

    def __init__(self, path: str) -> None:
        self._path = path

    async def read(self) -> TopData:
        text = await asyncio.to_thread(Path(self._path).read_text, "utf-8")
        return TopData.model_validate_json(text)
