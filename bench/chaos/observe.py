"""What the machine and the ledger say right now: one Snapshot, read the same way whatever is
down. Nothing here judges; checks.py does."""

import asyncio
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from temporalio.client import Client

from activities.agent import procfs
from bench.chaos.checks import AgentShard, EngineProcess, Snapshot, ready_replicas
from store.fleet import FleetTables
from workers.paths import Locations
from workers.progress import fleet_tables, ledger_snapshot
from workflows.client import connect
from workflows.contracts import LedgerState

# A frozen Temporal or control worker never answers: wait this long, then call it down.
LEDGER_TIMEOUT_S = 3.0
HEALTH_TIMEOUT_S = 2.0


def engine_processes(weights: str) -> list[EngineProcess]:
    """Live processes whose command line loads these weights (`-m PATH`), with their `--port`.
    The campaign's weights path is its own, so no other llmgw's engines are counted."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(entry.path, "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if weights not in argv or "-m" not in argv:
            continue
        stat = procfs.read_stat(int(entry.name))
        if stat is None or not stat.running:
            continue
        port = None
        if "--port" in argv and argv.index("--port") + 1 < len(argv):
            try:
                port = int(argv[argv.index("--port") + 1])
            except ValueError:
                port = None
        found.append(EngineProcess(stat.pid, stat.start_time, port))
    return found


def agent_shards(shards_dir: Path) -> dict[str, AgentShard]:
    """Replica -> the engine the agent's spec file names (a file being rewritten is skipped)."""
    shards = {}
    for path in shards_dir.glob("*.json"):
        try:
            spec = json.loads(path.read_text())
            shards[path.stem] = AgentShard(
                path.stem, int(spec["pid"]), int(spec["start_time"]), int(spec["port"])
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return shards


def pid_running(pid_file: Path) -> bool:
    """The process a pid file names exists and has not exited (a stopped one counts)."""
    try:
        stat = procfs.read_stat(int(pid_file.read_text()))
    except (OSError, ValueError):
        return False
    return stat is not None and stat.running


@dataclass
class Observer:
    temporal: str
    state_dir: Path
    node: str
    model: str
    weights: str
    base_url: str
    api_key: str
    children: tuple[str, ...] = ("temporal", "control", "agent", "gateway")
    _client: Client | None = None
    _fleet: FleetTables | None = None

    async def ledger(self) -> LedgerState | None:
        try:
            if self._client is None:
                self._client = await asyncio.wait_for(connect(self.temporal), LEDGER_TIMEOUT_S)
            if self._fleet is None:
                self._fleet = await fleet_tables(Locations.resolve(str(self.state_dir)))
            return await asyncio.wait_for(ledger_snapshot(self._fleet), LEDGER_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - chaos kills Temporal: any failure is "no ledger"
            return None

    async def take(self, http: httpx.AsyncClient) -> Snapshot:
        # Children first: a killed one is seen dead before `up` (1 s later) starts it again.
        children = {c: pid_running(self.state_dir / "run" / f"{c}.pid") for c in self.children}
        first = {e.identity: e for e in engine_processes(self.weights)}
        ledger = await self.ledger()
        still = {e.identity for e in engine_processes(self.weights)}
        snap = Snapshot(
            taken_at=0.0,
            ledger=ledger,
            engines=[e for i, e in first.items() if i in still],
            shards=agent_shards(self.state_dir / "agent" / self.node / "shards"),
            children=children,
        )
        if ledger is not None:
            for replica in ready_replicas(ledger, self.model):
                snap.healthy[replica] = await answers(http, f"{ledger.routes[replica].endpoint}")
        snap.gateway_ready = await self.gateway_ready(http)
        # Stamped when complete: a ledger read can wait out a restart of Temporal, and the
        # time to converge must not end before the reads that saw it did.
        snap.taken_at = time.monotonic()
        return snap

    async def gateway_ready(self, http: httpx.AsyncClient) -> int | None:
        headers = {"Authorization": f"Bearer {self.api_key}"}
        try:
            listed = await http.get(f"{self.base_url}/models", headers=headers)
            ready = {m["id"]: m.get("ready_replicas") for m in listed.json()["data"]}
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None
        count = ready.get(self.model)
        return count if isinstance(count, int) else None


async def answers(http: httpx.AsyncClient, endpoint: str) -> bool:
    try:
        response = await http.get(f"{endpoint}/health", timeout=HEALTH_TIMEOUT_S)
    except httpx.HTTPError:
        return False
    return response.status_code == 200
