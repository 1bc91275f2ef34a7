"""A whole llmgw on this machine for tests: `llmgw up` as a user runs it, in a temporary state
dir on free ports, driven through its CLI, its gateway and its Temporal server."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from temporalio.client import Client

from store.fleet import open_fleet
from tests.ports import free_port
from workflows.client import connect
from workflows.contracts import LedgerState, ReplicaState

REPO = Path(__file__).resolve().parents[1]
STANDIN_ENGINE = REPO / "tests" / "standin_llama_server"


# The first `llmgw up` on a machine builds llama-server from source.
FIRST_BUILD_ALLOWANCE_S = 40 * 60


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


class System:
    def __init__(self, state_dir: Path, *, demo: bool, engine_path: Path | None) -> None:
        self.state_dir = state_dir
        self.demo = demo
        self.engine_path = engine_path
        self.node = "testnode"
        self.port = free_port()
        self.admin_port = free_port()
        self.temporal_port = free_port()
        self.kv_feed_port = free_port()
        self.mirror_port = free_port()
        self.agent_metrics_port = free_port()
        self.process: subprocess.Popen[str] | None = None
        self.output: list[str] = []

    # --- lifecycle -----------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["LLMGW_STATE_DIR"] = str(self.state_dir)
        env["LLMGW_TEMPORAL_ADDRESS"] = f"127.0.0.1:{self.temporal_port}"
        env.pop("LLMGW_DATABASE_URL", None)
        return env

    def start(self, timeout: float = 300.0) -> None:
        cmd = [
            sys.executable, "-m", "workers.cli", "up", "--node", self.node, "--headless",
            "--port", str(self.port), "--temporal-port", str(self.temporal_port),
            "--admin-port", str(self.admin_port), "--kv-feed-port", str(self.kv_feed_port),
            "--mirror-port", str(self.mirror_port),
            "--agent-metrics-port", str(self.agent_metrics_port),
        ]  # fmt: skip
        if not self.demo:
            cmd.append("--no-demo")
        if self.engine_path is not None:
            cmd += ["--engine-path", f"llamacpp={self.engine_path}"]
        self.output = []
        self.process = subprocess.Popen(
            cmd, cwd=REPO, env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, bufsize=1,
        )  # fmt: skip
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        for line in self.process.stdout:
            self.output.append(line.rstrip())
            if "Ctrl-C stops everything" in line:
                break
            if time.monotonic() > deadline:
                raise AssertionError("llmgw up did not come up:\n" + "\n".join(self.output))
        else:
            raise AssertionError("llmgw up exited:\n" + "\n".join(self.output))
        # Keep draining its output so it never blocks on a full pipe.
        import threading

        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.process is not None
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line.rstrip())

    def stop(self) -> int:
        """Ctrl-C, as a user would; returns up's exit status."""
        assert self.process is not None
        self.process.send_signal(signal.SIGINT)
        return self.process.wait(60)

    # --- what a user sees ----------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def api_key(self) -> str:
        return (self.state_dir / "quickstart.key").read_text().strip()

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "-m", "workers.cli", *args],
            cwd=REPO, env=self.env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if check and result.returncode != 0:
            raise AssertionError(f"llmgw {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
        return result

    async def client(self) -> Client:
        return await connect(f"127.0.0.1:{self.temporal_port}")

    async def ledger(self) -> LedgerState:
        """The fleet tables as `llmgw up` keeps them: the SQLite store in its state dir."""
        fleet = open_fleet(None, self.state_dir, pool_size=1)
        try:
            await fleet.init()
            return await fleet.snapshot()
        finally:
            await fleet.close()

    async def ready_replicas(self, model: str) -> list[str]:
        state = await self.ledger()
        return sorted(
            r.replica_id
            for r in state.routes.values()
            if r.model == model and r.state == ReplicaState.READY
        )

    async def until(self, check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
        """Poll `check` until true; on timeout fail with what `llmgw status` shows."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not await check():
            if asyncio.get_running_loop().time() > deadline:
                status = self.cli("status", check=False).stdout
                raise AssertionError(f"timed out after {timeout}s waiting for {what}:\n{status}")
            await asyncio.sleep(0.2)

    async def released(self, model: str) -> bool:
        """No allocation of the model is left in the ledger."""
        state = await self.ledger()
        return not any(a.replica_id.startswith(f"{model}-") for a in state.allocations.values())

    # --- what the machine runs -----------------------------------------------------------

    def child_pid(self, name: str) -> int:
        return int((self.state_dir / "run" / f"{name}.pid").read_text())

    def engine_pid(self, replica_id: str) -> int | None:
        """The pid in the agent's spec file for the replica; None while there is none (between
        an engine's death and its replacement's start)."""
        path = self.state_dir / "agent" / self.node / "shards" / f"{replica_id}.json"
        try:
            return int(json.loads(path.read_text())["pid"])
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def engine_processes(self, model_weights: str) -> list[int]:
        """Live processes whose command line serves these weights (engines, not wrappers)."""
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
                stat = (proc / "stat").read_text()
            except OSError:
                continue
            if stat.split(") ", 1)[-1].startswith("Z"):
                continue  # a zombie serves nothing
            if model_weights.encode() in cmdline and b"-m" in cmdline:
                pids.append(int(proc.name))
        return pids


async def wait_ready(system: System, model: str, count: int, timeout: float = 60) -> list[str]:
    """Until the ledger has `count` ready replicas of the model and the gateway routes to them
    (its routing table follows the ledger within about a second)."""
    deadline = asyncio.get_running_loop().time() + timeout
    async with httpx.AsyncClient(timeout=10) as http:
        while True:
            ready = await system.ready_replicas(model)
            if len(ready) == count:
                listed = await models_listed(http, system)
                routed = {m["id"]: m.get("ready_replicas") for m in listed}
                if routed.get(model) == count and await engines_answer(http, system, ready):
                    return ready
            if asyncio.get_running_loop().time() > deadline:
                status = system.cli("status").stdout
                raise AssertionError(f"{model}: {len(ready)} of {count} ready; {status}")
            await asyncio.sleep(0.2)


async def models_listed(http: httpx.AsyncClient, system: System) -> list[dict[str, Any]]:
    """The gateway's /v1/models list; anything but a list there fails the test with what the
    gateway answered and the tail of its log."""
    headers = {"Authorization": f"Bearer {system.api_key}"}
    answer = await http.get(f"{system.base_url}/models", headers=headers)
    if answer.status_code != 200:
        log = system.state_dir / "logs" / "gateway.log"
        tail = log.read_text(errors="replace").splitlines()[-30:] if log.exists() else []
        raise AssertionError(
            f"GET {system.base_url}/models answered {answer.status_code}: {answer.text}\n"
            + "gateway.log, last lines:\n"
            + "\n".join(tail)
        )
    data: list[dict[str, Any]] = answer.json()["data"]
    return data


async def engines_answer(http: httpx.AsyncClient, system: System, replicas: list[str]) -> bool:
    """The ledger can still hold a route from before a restart; ask the engines themselves."""
    state = await system.ledger()
    for replica in replicas:
        try:
            health = await http.get(f"{state.routes[replica].endpoint}/health")
        except httpx.HTTPError:
            return False
        if health.status_code != 200:
            return False
    return True


def running_system(state_dir: Path, *, demo: bool = True) -> Iterator[System]:
    """`llmgw up` in `state_dir` for a module's tests (a fixture yields from it), stopped after
    them unless a test stopped it."""
    system = System(state_dir, demo=demo, engine_path=None)
    system.start(timeout=FIRST_BUILD_ALLOWANCE_S)
    yield system
    if system.process is not None and system.process.poll() is None:
        assert system.stop() == 0
