"""Three nodes on one machine for integration tests: `llmgw up`'s own agent plus agents joined
with tokens, each a separate process with its own state dir and address (127.0.0.2, 127.0.0.3),
so their engines' ports cannot collide. Also the checks a fleet's ledger must always pass."""

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import PendingActivityState

# The ledger's invariants live with `make chaos`, which checks them too; re-exported here.
from bench.chaos.checks import ledger_violations as ledger_violations
from tests.system import REPO, STANDIN_ENGINE, System
from workflows.contracts import NodeState, ReplicaState

# Joined agents' liveness, short for tests: unreachable after LOST_AFTER_S of silence, lost
# (replicas move) after GONE_AFTER_S.
LOST_AFTER_S = 6
GONE_AFTER_S = 12
JOINED = (("n2", "127.0.0.2"), ("n3", "127.0.0.3"))


class Agent:
    """One `llmgw agent --join TOKEN` process."""

    def __init__(self, system: System, name: str, address: str, state_dir: Path) -> None:
        self.system, self.name, self.address, self.state_dir = system, name, address, state_dir
        self.process: subprocess.Popen[bytes] | None = None
        self.token = ""
        self.log = state_dir / "agent.log"

    def start(self, token: str | None = None) -> None:
        """Start with the token, or again with the one it was first given (as a systemd unit
        does, with the token in its environment file)."""
        self.token = token or self.token
        self.state_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable, "-m", "workers.cli", "agent", "--node", self.name,
            "--state-dir", str(self.state_dir), "--address", self.address,
            "--engine-path", f"llamacpp={STANDIN_ENGINE}", "--label", f"rack={self.name}",
            "--heartbeat-every", "1", "--lost-after", str(LOST_AFTER_S),
            "--gone-after", str(GONE_AFTER_S),
            "--stop-engines-on-exit",
        ]  # fmt: skip
        cmd += ["--join", self.token]
        env = self.system.env()
        env.pop("LLMGW_TEMPORAL_ADDRESS")  # the token says where Temporal is
        # As `llmgw up` does for its agent: engines find this environment's Python first.
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=log)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        for pid in self.engine_pids().values():  # what a killed agent left behind
            if pid_alive(pid):
                os.killpg(pid, signal.SIGKILL)

    def engine_pids(self) -> dict[str, int]:
        return shard_pids(self.state_dir / "agent" / self.name / "shards")


def shard_pids(shards: Path) -> dict[str, int]:
    """Replica id -> engine pid, from an agent's spec files (skipping one being rewritten)."""
    pids = {}
    for path in shards.glob("*.json"):
        try:
            pids[path.stem] = int(json.loads(path.read_text())["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return pids


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return not stat.split(") ", 1)[-1].startswith("Z")  # a zombie serves nothing


def token_from(output: str) -> str:
    return next(w for w in output.split() if w.startswith("llmgw-join-"))


@contextmanager
def running_fleet(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[System, dict[str, Agent]]]:
    """`llmgw up --no-demo` with the stand-in engine and the JOINED agents; everything (leftover
    engines of killed agents included) stopped afterwards."""
    system = System(tmp_path_factory.mktemp("state"), demo=False, engine_path=STANDIN_ENGINE)
    system.start(timeout=120)
    agents: dict[str, Agent] = {}
    try:
        for name, address in JOINED:
            added = system.cli("node", "add", name, "--label", "tier=test")
            agent = Agent(system, name, address, tmp_path_factory.mktemp(name))
            agent.start(token_from(added.stdout))
            agents[name] = agent
        yield system, agents
    finally:
        for agent in agents.values():
            agent.stop()
        if system.process is not None and system.process.poll() is None:
            system.stop()


def engine_pid_on(system: System, agents: dict[str, Agent], node: str, replica: str) -> int | None:
    """The engine pid in the spec file of the replica on that node's agent, if any."""
    if node == system.node:
        return system.engine_pid(replica)
    return agents[node].engine_pids().get(replica)


async def nodes_ready(system: System, names: list[str]) -> bool:
    state = await system.ledger()
    return all(
        n in state.nodes
        and state.nodes[n].state == NodeState.READY
        and state.nodes[n].engines.get("llamacpp") is not None
        and state.nodes[n].engines["llamacpp"].state.value == "installed"
        for n in names
    )


async def replicas_by_node(system: System, model: str) -> dict[str, list[str]]:
    state = await system.ledger()
    placed: dict[str, list[str]] = {}
    for route in state.routes.values():
        if route.model == model and route.state == ReplicaState.READY:
            placed.setdefault(route.node, []).append(route.replica_id)
    return placed


async def diagnosis(system: System, agents: dict[str, Agent], lines: int = 15) -> str:
    """What a failed wait shows besides `llmgw status`: each replica workflow's pending
    activities (what it waits on, and how each last failed), and the tail of every log."""
    client = await system.client()
    found: list[str] = []
    # Each allocation names the replica workflow that holds it.
    for alloc in sorted((await system.ledger()).allocations.values(), key=lambda a: a.replica_id):
        handle = client.get_workflow_handle(alloc.workflow_id)
        try:
            pending = (await handle.describe()).raw_description.pending_activities
        except Exception as err:  # noqa: BLE001 - a diagnosis lists what it cannot read, too
            found.append(f"{alloc.replica_id}: not described ({err})")
            continue
        for activity in pending:
            state = (
                PendingActivityState.Name(activity.state)
                .removeprefix("PENDING_ACTIVITY_STATE_")
                .lower()
            )
            failed = activity.last_failure.message if activity.HasField("last_failure") else ""
            found.append(
                f"{alloc.replica_id}: {activity.activity_type.name}, attempt {activity.attempt}, "
                f"{state} {failed}".rstrip()
            )
        if not pending:
            found.append(f"{alloc.replica_id}: no pending activity")
    logs = [system.state_dir / "logs" / name for name in ("control.log", "agent.log")]
    for log in [*logs, *(agent.log for agent in agents.values())]:
        tail = log.read_text(errors="replace").splitlines()[-lines:] if log.exists() else []
        found.append(f"--- {log.parent.name}/{log.name}, last {lines} lines:\n" + "\n".join(tail))
    return "\n".join(found)
