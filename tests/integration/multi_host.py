"""An llmgw cluster across network namespaces, set up as docs/operations.md walks a several-machine
install: host `ctl` runs Temporal (bound to its address), the control worker and the gateway;
each node host runs `llmgw agent --join TOKEN --address <its address>` with the stand-in engine.
The test process sees into `ctl` through a probe (tests/integration/netns_probe.py) and reads the
agents' state directories on the shared file system."""

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.fleet import shard_pids, token_from
from tests.integration.netns_hosts import Host, Network, sweep_abandoned, why_unavailable
from tests.system import REPO, STANDIN_ENGINE
from workers.temporal_server import temporal_binary
from workflows.contracts import LedgerState

# Each host has its own ports: fixed ones cannot collide with anything on this machine.
TEMPORAL_PORT = 7233
GATEWAY_PORT = 8000
ADMIN_PORT = 8001
MIRROR_PORT = 8004
AGENT_METRICS_PORT = 8005
HEARTBEAT_EVERY_S = 1


@dataclass
class NodeHost:
    host: Host
    state_dir: Path
    process: subprocess.Popen[bytes]

    @property
    def name(self) -> str:
        return self.host.name

    def engine_pids(self) -> dict[str, int]:
        return shard_pids(self.state_dir / "agent" / self.name / "shards")


class Cluster:
    def __init__(self, network: Network, root: Path) -> None:
        self.network = network
        self.root = root
        self.ctl = network.add_host("ctl", 1)
        self.state_dir = root / "ctl"
        self.temporal = f"{self.ctl.address}:{TEMPORAL_PORT}"
        self.gateway = f"http://{self.ctl.address}:{GATEWAY_PORT}"
        self.processes: list[subprocess.Popen[bytes]] = []
        self.nodes: dict[str, NodeHost] = {}
        self.api_key = ""
        self._probe: subprocess.Popen[bytes] | None = None

    def env(self, state_dir: Path) -> dict[str, str]:
        env = dict(os.environ)
        env["LLMGW_STATE_DIR"] = str(state_dir)
        env["LLMGW_TEMPORAL_ADDRESS"] = self.temporal
        env.pop("LLMGW_DATABASE_URL", None)  # the gateway's SQLite store on ctl
        # Engines (the stand-in is a Python script) find this environment's Python first.
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        return env

    def _start(self, host: str, name: str, cmd: list[str], env: dict[str, str]) -> None:
        log = self.root / "logs" / f"{host}-{name}.log"
        self.processes.append(self.network.popen(host, cmd, env=env, log=log, cwd=REPO))

    def llmgw_cmd(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "workers.cli", *args]

    # --- the control host ----------------------------------------------------------------

    async def start_control_plane(self) -> None:
        env = self.env(self.state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # All addresses: the dev server (temporal CLI 1.9.1) bound to one address other than
        # loopback listens there with its internal services too, yet dials them on 127.0.0.1,
        # and answers nothing. In ctl's namespace "all" is loopback and ctl's own address.
        self._start("ctl", "temporal", [
            temporal_binary(), "server", "start-dev",
            "--db-filename", str(self.state_dir / "temporal.db"),
            "--ip", "0.0.0.0", "--port", str(TEMPORAL_PORT),
            "--http-port", str(TEMPORAL_PORT + 10), "--headless", "--log-level", "warn",
        ], env)  # fmt: skip
        self._start("ctl", "control", self.llmgw_cmd("control"), env)
        # The key first: it makes the store (and the engine-key master secret) before the
        # gateway opens it.
        created = self.cli("key", "create", "multi-host")
        self.api_key = created.stdout.strip().splitlines()[-1]
        self._start("ctl", "gateway", self.llmgw_cmd(
            "gateway", "--host", self.ctl.address, "--port", str(GATEWAY_PORT),
            "--admin-port", str(ADMIN_PORT),
            # Every replica in turn, so that a few requests reach every host's engine.
            "--routing", "round_robin",
        ), env)  # fmt: skip
        # The model mirror, which nodes fetch artifacts from across the network.
        self._start("ctl", "mirror", self.llmgw_cmd(
            "mirror", "serve", "--host", self.ctl.address, "--port", str(MIRROR_PORT),
        ), env)  # fmt: skip
        probe_log = self.root / "logs" / "ctl-probe.log"
        self._probe = self.network.popen(
            "ctl",
            [sys.executable, "-m", "tests.integration.netns_probe"],
            env=env, log=probe_log, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        self.processes.append(self._probe)
        await self.until(self._ledger_answers, 120, "the fleet tables to answer on ctl")
        await self.until(self._gateway_answers, 60, "the gateway to answer on ctl")
        await self.until(self._mirror_answers, 60, "the mirror to answer on ctl")

    async def _ledger_answers(self) -> bool:
        return "ledger" in await self.ask({"op": "ledger"})

    async def _gateway_answers(self) -> bool:
        return (await self.http("GET", f"{self.gateway}/healthz")).get("status") == 200

    async def _mirror_answers(self) -> bool:
        # Any answer will do: without a node's token it is 401.
        url = f"http://{self.ctl.address}:{MIRROR_PORT}/mirror/v1/manifests/x"
        return "status" in await self.http("GET", url)

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`llmgw ARGS` on ctl."""
        env = self.env(self.state_dir)
        result = self.network.run("ctl", self.llmgw_cmd(*args), env=env, cwd=REPO, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"llmgw {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
        return result

    # --- node hosts ----------------------------------------------------------------------

    def add_node(self, name: str, last_octet: int, *, lost_after: int, gone_after: int) -> None:
        """A host of its own, a token from `node add` on ctl, and its agent joining with it."""
        host = self.network.add_host(name, last_octet)
        added = self.cli("node", "add", name, "--address", host.address,
                         "--join-address", self.temporal)  # fmt: skip
        state_dir = self.root / name
        env = self.env(state_dir)
        env.pop("LLMGW_TEMPORAL_ADDRESS")  # the token says where Temporal is
        cmd = self.llmgw_cmd(
            "agent", "--join", token_from(added.stdout), "--address", host.address,
            "--engine-path", f"llamacpp={STANDIN_ENGINE}", "--label", f"host={name}",
            "--heartbeat-every", str(HEARTBEAT_EVERY_S),
            "--lost-after", str(lost_after), "--gone-after", str(gone_after),
            "--metrics-host", host.address, "--metrics-port", str(AGENT_METRICS_PORT),
            "--mirror", f"http://{self.ctl.address}:{MIRROR_PORT}",
            "--stop-engines-on-exit",
        )  # fmt: skip
        state_dir.mkdir(parents=True, exist_ok=True)
        log = self.root / "logs" / f"{name}-agent.log"
        process = self.network.popen(name, cmd, env=env, log=log, cwd=REPO)
        self.processes.append(process)
        self.nodes[name] = NodeHost(host, state_dir, process)

    # --- seeing from ctl -----------------------------------------------------------------

    async def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        probe = self._probe
        assert probe is not None

        def exchange() -> dict[str, Any]:
            assert probe.stdin is not None
            assert probe.stdout is not None
            probe.stdin.write(json.dumps(request).encode() + b"\n")
            probe.stdin.flush()
            line = probe.stdout.readline()
            if not line:
                raise AssertionError(f"the probe on ctl exited ({probe.poll()}); see its log")
            answer: dict[str, Any] = json.loads(line)
            return answer

        return await asyncio.to_thread(exchange)

    async def ledger(self) -> LedgerState:
        answer = await self.ask({"op": "ledger"})
        if "ledger" not in answer:
            raise AssertionError(f"the ledger did not answer: {answer}")
        return LedgerState.model_validate(answer["ledger"])

    async def http(self, method: str, url: str, **request: Any) -> dict[str, Any]:
        """An HTTP request made from ctl: {"status", "text"} or {"error"}."""
        return await self.ask({"op": "http", "method": method, "url": url, **request})

    async def chat(self, model: str, text: str) -> int:
        answer = await self.http(
            "POST",
            f"{self.gateway}/v1/chat/completions",
            headers={"Authorization": f"Bearer {self.api_key}"},
            json={
                "model": model,
                "messages": [{"role": "user", "content": text}],
                "max_tokens": 4,
            },
            timeout=30,
        )
        return int(answer.get("status", 0))

    async def gateway_ready_replicas(self, model: str) -> int | None:
        answer = await self.http(
            "GET", f"{self.gateway}/v1/models", headers={"Authorization": f"Bearer {self.api_key}"}
        )
        if answer.get("status") != 200:
            return None
        listed = json.loads(answer["text"])["data"]
        return next((m["ready_replicas"] for m in listed if m["id"] == model), None)

    async def gateway_routes(self) -> list[dict[str, Any]]:
        """The gateway's own routing table, from its admin API (loopback on ctl)."""
        answer = await self.http("GET", f"http://127.0.0.1:{ADMIN_PORT}/admin/v1/routes")
        assert answer.get("status") == 200, answer
        routes: list[dict[str, Any]] = json.loads(answer["text"])["routes"]
        return routes

    async def agent_metrics(self, node: str) -> str:
        """The node agent's /metrics, read across the network from ctl ("" when unreachable)."""
        address = self.nodes[node].host.address
        answer = await self.http("GET", f"http://{address}:{AGENT_METRICS_PORT}/metrics")
        return str(answer["text"]) if answer.get("status") == 200 else ""

    async def until(self, check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while not await check():
            if asyncio.get_running_loop().time() > deadline:
                status = self.cli("status", check=False)
                seen = status.stdout + status.stderr
                raise AssertionError(f"timed out after {timeout}s waiting for {what}:\n{seen}")
            await asyncio.sleep(0.5)

    # --- the end ------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop agents first, so that they stop their engines; the network's destroy kills
        whatever is left."""
        for node in self.nodes.values():
            if node.process.poll() is None:
                node.process.terminate()
        for node in self.nodes.values():
            try:
                node.process.wait(20)
            except subprocess.TimeoutExpired:
                node.process.kill()
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


@asynccontextmanager
async def control_plane_in_namespaces(root: Path) -> AsyncIterator[Cluster]:
    """A cluster's control plane on host `ctl`, the namespaces removed after (and checked
    removed). Skipped, saying why, where namespaces cannot be made, unless
    LLMGW_REQUIRE_NETNS=1 (`make test` as root), which fails instead."""
    why = why_unavailable()
    if why is not None:
        if os.environ.get("LLMGW_REQUIRE_NETNS") == "1":
            pytest.fail(f"no network namespaces here ({why}); LLMGW_REQUIRE_NETNS=0 skips")
        pytest.skip(f"no network namespaces here: {why}")
    sweep_abandoned()
    network = Network()
    cluster: Cluster | None = None
    try:
        network.create()
        cluster = Cluster(network, root)
        await cluster.start_control_plane()
        yield cluster
    finally:
        if cluster is not None:
            cluster.stop()
        problems = network.destroy()
        assert not problems, f"the test's namespaces were not all removed: {problems}"
