"""The node agent's Temporal activities: discovery, engine installs, and the life of engine
processes on this machine. Registered by the agent's worker on `node_task_queue(node)`.

Blocking work (subprocesses, builds, /proc scans) runs in threads so the activities can keep
heartbeating; the heartbeat details are what the Temporal UI shows an operator.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import procfs
from activities.discovery import discover_inventory
from activities.engine_metrics import scrape, wait_idle
from activities.engines import sglang, vllm
from activities.engines import trtllm as trtllm_cmd
from activities.engines.commands import Command, ShardPlace
from activities.engines.install_llamacpp import (
    install_llamacpp,
    installed_binary,
    nvidia_driver_loaded,
)
from activities.engines.llamacpp import ENGINE as LLAMACPP
from activities.engines.llamacpp import LLAMACPP_DEFAULT_VERSION, command_line, engine_env
from activities.engines.python_env import env_is_cpu_build, install_python_engine
from activities.engines.python_env import reverify as reverify_python_env
from activities.engines.shard_env import shard_env
from activities.engines.trtllm import check_trtllm
from activities.engines.verify import Verification, verify_llamacpp
from activities.node_secrets import SecretMissing, SecretUnsafe, resolve_env
from activities.readiness import gpu_memory_problem, query_compute_apps, wait_ready
from activities.supervisor import ReplicaBusy, ShardSupervisor
from workflows.contracts import (
    DiscoverRequest,
    EngineExit,
    EngineInstallRequest,
    EngineLoad,
    EngineLoadReport,
    EngineLoadRequest,
    EngineRequirement,
    EngineState,
    EngineStatus,
    LaunchRequest,
    LaunchResult,
    NodeInventory,
    PortsInUse,
    Profile,
    ReadyRequest,
    ReadyResult,
    ShardAllocation,
    ShardRef,
    StopResult,
    VerifyEnginesRequest,
    VerifyEnginesResult,
)
from workflows.engine_keys import engine_key
from workflows.engine_plan import SGLANG, TRTLLM, VLLM
from workflows.names import NodeActivity
from workflows.placement.ports import KV_PUB, KV_REPLAY, RENDEZVOUS, extra_port_names

# Only these reach an engine from the agent's environment; the key is added explicitly. Anything
# else the agent holds (credentials, the node secret's source) stays out of engine processes.
INHERITED_ENV = ("PATH", "HOME", "LANG")
INSTALL_HEARTBEAT_S = 3.0
LAUNCHER = Path(__file__).resolve().parent / "shard_launcher.py"
# Ports a shard needs besides its HTTP port, for allocations from before placement handed them
# out (ShardAllocation.extra_ports): derived from the HTTP port, above the node's range.
RENDEZVOUS_PORT_OFFSET = 10000
KV_PUB_PORT_OFFSET = 11000
KV_REPLAY_PORT_OFFSET = 12000

T = TypeVar("T")


@dataclass
class AgentConfig:
    node: str
    address: str
    state_dir: Path
    cache_dir: Path
    node_secret: bytes = field(repr=False)
    # engine name -> an operator-provided binary used instead of an installed one.
    engine_paths: dict[str, str] = field(default_factory=dict)
    supervise_poll_s: float = 2.0
    ready_poll_s: float = 0.5
    stop_grace_s: float = 10.0
    # Whether an NVIDIA driver is loaded here; None: look in /proc when asked.
    nvidia: bool | None = None

    @property
    def has_nvidia(self) -> bool:
        return nvidia_driver_loaded() if self.nvidia is None else self.nvidia

    @property
    def engines_root(self) -> Path:
        return self.state_dir / "engines"

    @property
    def agent_dir(self) -> Path:
        return self.state_dir / "agent" / self.node

    @property
    def secrets_dir(self) -> Path:
        """Secrets engines' env references by name (activities/node_secrets.py)."""
        return self.agent_dir / "secrets"


@dataclass(frozen=True)
class DeadShard:
    """An engine that ended while no agent watched: reported to its replica workflow at boot."""

    workflow_id: str
    exit: EngineExit


def port_free(address: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError:
            return False
        return True


def shard_ports(
    shard: ShardAllocation, leader: ShardAllocation, profile: Profile, rank: int
) -> dict[str, int]:
    """The rendezvous point (the leader's) and this shard's KV-event ports: as placement handed
    them out, or derived from the HTTP port for an allocation from before it did."""
    ports = {
        RENDEZVOUS: leader.extra_ports.get(RENDEZVOUS, leader.port + RENDEZVOUS_PORT_OFFSET),
        KV_PUB: shard.extra_ports.get(KV_PUB, shard.port + KV_PUB_PORT_OFFSET),
        KV_REPLAY: shard.extra_ports.get(KV_REPLAY, shard.port + KV_REPLAY_PORT_OFFSET),
    }
    return ports


def _not_retryable(message: str, kind: str) -> ApplicationError:
    return ApplicationError(message, type=kind, non_retryable=True)


def launch_argv(commands: list[Command], wait_s: float = vllm.RENDEZVOUS_WAIT_S) -> list[str]:
    """One command as itself; sidecars, or a wait for a rendezvous point, through the shard
    launcher, which leads the process group they all share (so a stop reaches every one)."""
    if len(commands) == 1 and commands[0].wait_for is None:
        return list(commands[0].argv)
    plan = {
        "commands": [{"argv": c.argv, "wait_for": c.wait_for} for c in commands],
        "wait_s": wait_s,
    }
    return [sys.executable, "-I", str(LAUNCHER), json.dumps(plan, separators=(",", ":"))]


class NodeAgentActivities:
    def __init__(self, config: AgentConfig) -> None:
        self._config = config
        self._supervisor = ShardSupervisor(config.agent_dir / "shards", config.agent_dir / "logs")
        # The machine as last discovered: a multi-node shard's NCCL environment comes from it.
        self._inventory: NodeInventory | None = None

    @property
    def supervisor(self) -> ShardSupervisor:
        return self._supervisor

    def all(self) -> list[Callable[..., Awaitable[object]]]:
        """Every activity, for the agent's worker."""
        return [
            self.discover,
            self.install_engine,
            self.start_engine,
            self.wait_ready,
            self.supervise_engine,
            self.stop_engine,
            self.verify_engines,
            self.engine_load,
        ]

    # --- discovery and installs ----------------------------------------------------------

    @activity.defn(name=NodeActivity.DISCOVER)
    async def discover(self, req: DiscoverRequest) -> NodeInventory:
        if req.node != self._config.node:
            raise _not_retryable(
                f"discovery for node {req.node} reached agent {self._config.node}", "WrongNode"
            )
        inventory = await asyncio.to_thread(
            discover_inventory, self._config.node, self._config.address
        )
        self._inventory = inventory
        return inventory

    @activity.defn(name=NodeActivity.INSTALL_ENGINE)
    async def install_engine(self, req: EngineInstallRequest) -> EngineStatus:
        requirement = req.requirement
        configured = self._config.engine_paths.get(requirement.engine)
        if requirement.path is None and configured:
            requirement = requirement.model_copy(update={"path": configured})
        latest = [f"installing {requirement.engine} {requirement.version}"]

        def progress(line: str) -> None:
            latest[0] = line  # read by the heartbeat loop below; a list cell is thread-safe

        work = self._installer(requirement, progress)
        if work is None:
            return EngineStatus(
                engine=requirement.engine,
                version=requirement.version,
                state=EngineState.FAILED,
                detail=f"engine {requirement.engine} is not supported on this node",
            )
        return await self._heartbeating(work, lambda: latest[0])

    def _installer(
        self, req: EngineRequirement, progress: Callable[[str], None]
    ) -> Callable[[], EngineStatus] | None:
        root, cache = self._config.engines_root, self._config.cache_dir
        if req.engine == LLAMACPP:
            return lambda: install_llamacpp(req, root, cache, progress, self._config.has_nvidia)
        if req.engine in (VLLM, SGLANG):
            return lambda: install_python_engine(
                req, root, cache, progress, self._config.has_nvidia
            )
        if req.engine == TRTLLM:
            return lambda: check_trtllm(req)
        return None

    @activity.defn(name=NodeActivity.VERIFY_ENGINES)
    async def verify_engines(self, req: VerifyEnginesRequest) -> VerifyEnginesResult:
        """Run each installed engine's checks again: an upgrade elsewhere can take a library
        away, and a later failure must be reported, not hidden behind the first success."""
        if req.node != self._config.node:
            raise _not_retryable(
                f"verification for node {req.node} reached agent {self._config.node}", "WrongNode"
            )
        latest = ["re-verifying engines"]

        def run_all() -> VerifyEnginesResult:
            result = VerifyEnginesResult()
            for status in req.engines:
                latest[0] = f"verifying {status.engine} {status.version}"
                result.engines.append(self._reverify(status))
            return result

        return await self._heartbeating(run_all, lambda: latest[0])

    def _reverify(self, status: EngineStatus) -> EngineStatus:
        if status.state not in (EngineState.INSTALLED, EngineState.FAILED) or not status.path:
            return status  # nothing installed to check; the install workflow owns the rest
        if not status.path:
            check = Verification(False, "no path recorded for the installed engine")
        elif status.engine == LLAMACPP:
            check = verify_llamacpp(Path(status.path))
        elif status.engine in (VLLM, SGLANG):
            entry = Path(status.path)
            cpu = env_is_cpu_build(entry.parent.parent)
            req = EngineRequirement(
                engine=status.engine, version=status.version, package="-cpu" if cpu else None
            )
            check = reverify_python_env(req, entry, self._config.has_nvidia)
        elif status.engine == TRTLLM:
            trt = check_trtllm(
                EngineRequirement(engine=TRTLLM, version=status.version, path=status.path)
            )
            check = Verification(trt.state is EngineState.INSTALLED, trt.detail)
        else:
            check = Verification(False, f"engine {status.engine} is not supported on this node")
        if not check.ok:
            return status.model_copy(
                update={
                    "state": EngineState.FAILED,
                    "detail": f"re-verification failed: {check.detail}",
                }
            )
        now = datetime.now(UTC).isoformat(timespec="seconds")
        return status.model_copy(
            update={
                # A failed engine that runs again (a library put back) is installed again.
                "state": EngineState.INSTALLED,
                "detail": "; ".join((check.detail, *check.notes)),
                "verified_at": now,
            }
        )

    @staticmethod
    async def _heartbeating(work: Callable[[], T], details: Callable[[], str]) -> T:
        """Run blocking `work` in a thread, heartbeating its latest progress until it ends."""
        task = asyncio.ensure_future(asyncio.to_thread(work))
        while True:
            activity.heartbeat(details())
            done, _ = await asyncio.wait({task}, timeout=INSTALL_HEARTBEAT_S)
            if done:
                return task.result()

    # --- engine processes ----------------------------------------------------------------

    def _binary(self, engine: str, version: str) -> Path:
        configured = self._config.engine_paths.get(engine)
        if configured:
            path = Path(configured)
            # A Python engine's operator path may name its environment rather than its script.
            return path / "bin" / engine if path.is_dir() else path
        binary = installed_binary(self._config.engines_root, engine, version)
        if binary is None:
            raise _not_retryable(
                f"engine {engine} {version} is not installed on node {self._config.node}",
                "EngineNotInstalled",
            )
        return binary

    def _engine_env(self, extra: dict[str, str]) -> dict[str, str]:
        env = {name: os.environ[name] for name in INHERITED_ENV if name in os.environ}
        env.update(extra)
        return env

    @activity.defn(name=NodeActivity.START_ENGINE)
    async def start_engine(self, req: LaunchRequest) -> LaunchResult:
        # If this attempt times out, its thread runs on; the retry then waits on the replica's
        # lock and adopts what this one started (ShardSupervisor.launch).
        try:
            return await asyncio.to_thread(self._launch, req)
        except ReplicaBusy as err:
            raise ApplicationError(str(err), type="ReplicaBusy") from err  # retried

    def _my_shard(self, req: LaunchRequest) -> tuple[Profile, list[ShardAllocation], int]:
        """The profile the replica was placed with, every shard, and this node's rank."""
        model, alloc = req.model, req.allocation
        if not 0 <= alloc.profile_index < len(model.profiles):
            raise _not_retryable(
                f"model {model.name} has no profile {alloc.profile_index}", "InvalidModelArgs"
            )
        shards = alloc.shards_or_leader()
        for rank, shard in enumerate(shards):
            if shard.node == self._config.node:
                return model.profiles[alloc.profile_index], shards, rank
        raise _not_retryable(
            f"replica {req.replica_id} has no shard on node {self._config.node}", "WrongNode"
        )

    def _node_inventory(self) -> NodeInventory:
        if self._inventory is None:
            self._inventory = discover_inventory(self._config.node, self._config.address)
        return self._inventory

    def _commands(
        self,
        req: LaunchRequest,
        profile: Profile,
        binary: Path,
        place: ShardPlace,
        key: str,
        kv_ports: tuple[int, int],
    ) -> tuple[list[Command], dict[str, str]]:
        """This shard's commands (sidecars first) and the engine's own environment."""
        model, engine = req.model, profile.engine
        if engine == VLLM:
            cpu = profile.gpu_class is None or not self._config.has_nvidia
            commands = vllm.launch_commands(
                str(binary),
                model,
                profile,
                place,
                cpu=cpu,
                kv_ports=kv_ports,
                kv_topic=req.replica_id,
            )
            return commands, vllm.engine_env(key, profile, place, cpu=cpu)
        if engine == SGLANG:
            python = binary if binary.name.startswith("python") else binary.parent / "python"
            return [Command(sglang.command_line(str(python), model, profile, place))], (
                sglang.engine_env(key)
            )
        if engine == TRTLLM:
            serve = binary if binary.name == "trtllm-serve" else binary.parent / "trtllm-serve"
            return [Command(trtllm_cmd.command_line(str(serve), model, profile, place))], {}
        threads = place.cpu_cores or profile.cpu_cores
        argv = command_line(str(binary), model, profile, place.address, place.port, threads)
        return [Command(argv)], engine_env(key)

    def _launch(self, req: LaunchRequest) -> LaunchResult:
        model = req.model
        profile, shards, rank = self._my_shard(req)
        engine = profile.engine
        if engine not in (LLAMACPP, VLLM, SGLANG, TRTLLM):
            raise _not_retryable(
                f"engine {engine} is not supported on this node yet", "EngineNotSupported"
            )
        version = profile.engine_version or (LLAMACPP_DEFAULT_VERSION if engine == LLAMACPP else "")
        if not version:
            raise _not_retryable(
                f"model {model.name}: engine_version is required for {engine}",
                "InvalidModelArgs",
            )
        binary = self._binary(engine, version)
        if not Path(model.weights).exists():
            raise _not_retryable(
                f"weights {model.weights} for model {model.name} not found on node "
                f"{self._config.node}",
                "WeightsMissing",
            )
        shard, leader = shards[rank], shards[0]
        ports = shard_ports(shard, leader, profile, rank)
        place = ShardPlace(
            address=self._config.address,
            port=shard.port,
            rank=rank,
            nodes=len(shards),
            leader_address=leader.address,
            rendezvous_port=ports[RENDEZVOUS],
            gpus=list(shard.gpu_uuids),
            cpu_cores=shard.cpu_cores,
        )
        key = engine_key(self._config.node_secret, req.replica_id)
        try:
            kv_ports = (ports[KV_PUB], ports[KV_REPLAY])
            commands, own_env = self._commands(req, profile, binary, place, key, kv_ports)
            extra = shard_env(
                engine=engine,
                address=self._config.address,
                gpu_uuids=list(shard.gpu_uuids),
                profile_env=profile.env,
                nodes=len(shards),
                fabric=req.allocation.fabric,
                inventory=self._node_inventory() if len(shards) > 1 else None,
            )
        except ValueError as err:
            raise _not_retryable(str(err), "InvalidModelArgs") from err
        for name, reason in sorted(extra.dropped.items()):
            # Refused when the model was defined; dropped again whatever sent the profile.
            activity.logger.warning("model %s: env %s dropped, %s", model.name, name, reason)
        try:
            # Secrets last, after the policy: a value read here is never logged or returned.
            resolved = resolve_env(extra.env, self._config.secrets_dir)
        except (SecretMissing, SecretUnsafe) as err:
            raise _not_retryable(
                f"model {model.name} on node {self._config.node}: {err} (set it there with "
                "`llmgw secret set NAME`)",
                type(err).__name__,
            ) from None
        env = self._engine_env({**own_env, **resolved})
        # Checked only when an engine is really started (not on an adoption), under the
        # replica's lock: every port this shard binds must be free.
        binds = sorted({shard.port, *(ports[name] for name in extra_port_names(profile, rank))})

        def ports_free() -> None:
            held = [p for p in binds if not port_free(self._config.address, p)]
            if held:
                # Something outside llmgw holds them: the engine would fail to bind (or the
                # readiness probe knock on the stranger's door). Not retried: the replica
                # places again without them (PortsInUse in the details).
                listed = ", ".join(map(str, held))
                raise ApplicationError(
                    f"port {listed} on node {self._config.node} is in use by another process",
                    PortsInUse(node=self._config.node, ports=held).model_dump(),
                    type="PortInUse",
                    non_retryable=True,
                )

        return self._supervisor.launch(
            req.replica_id,
            req.workflow_id,
            launch_argv(commands),
            env,
            model.profile_fingerprint(req.allocation.profile_index),
            shard.port,
            gpu_uuids=list(shard.gpu_uuids),
            before_start=ports_free,
        )

    @activity.defn(name=NodeActivity.WAIT_READY)
    async def wait_ready(self, req: ReadyRequest) -> ReadyResult:
        def heartbeat() -> None:
            activity.heartbeat(f"waiting for {req.replica_id} on port {req.port} to load")

        spec = self._supervisor.read_spec(req.replica_id)
        gpu_check = None
        if spec is not None and spec.gpu_uuids:
            uuids, pgid = list(spec.gpu_uuids), spec.pid

            def gpu_check() -> str:
                return gpu_memory_problem(uuids, procfs.group_members(pgid), query_compute_apps())

        return await wait_ready(
            req.port,
            engine_key(self._config.node_secret, req.replica_id),
            req.timeout_s,
            heartbeat,
            lambda: self._supervisor.is_alive(req.replica_id),
            poll_s=self._config.ready_poll_s,
            host=self._config.address,
            gpu_check=gpu_check,
        )

    @activity.defn(name=NodeActivity.SUPERVISE_ENGINE)
    async def supervise_engine(self, req: ShardRef) -> EngineExit:
        spec = self._supervisor.read_spec(req.replica_id)
        pid = spec.pid if spec else None

        def heartbeat() -> None:
            activity.heartbeat(f"engine {req.replica_id} running (pid {pid})")

        # Cancellation (replica stopping, agent shutting down) arrives as CancelledError out of
        # the wait and is left to propagate: the engine outlives its watch, and stopping it is
        # STOP_ENGINE's job alone.
        return await self._supervisor.wait_exit(
            req.replica_id, heartbeat, self._config.supervise_poll_s
        )

    @activity.defn(name=NodeActivity.ENGINE_LOAD)
    async def engine_load(self, req: EngineLoadRequest) -> EngineLoadReport:
        """Each engine's running and waiting requests and token counters, from its metrics
        (asked with its key, which only this agent and the gateway can derive)."""

        async def one(replica_id: str) -> EngineLoad:
            spec = self._supervisor.read_spec(replica_id)
            if spec is None:
                return EngineLoad(replica_id=replica_id, seen=False)
            found = await scrape(
                f"http://{self._config.address}:{spec.port}/metrics",
                engine_key(self._config.node_secret, replica_id),
            )
            if found is None:
                return EngineLoad(replica_id=replica_id, seen=False)
            return EngineLoad(
                replica_id=replica_id,
                running=found.running,
                waiting=found.waiting,
                work=found.work,
            )

        return EngineLoadReport(engines=list(await asyncio.gather(*map(one, req.replica_ids))))

    @activity.defn(name=NodeActivity.STOP_ENGINE)
    async def stop_engine(self, req: ShardRef) -> StopResult:
        spec = self._supervisor.read_spec(req.replica_id) if req.drain_s > 0 else None
        if spec is not None and self._supervisor.is_alive(req.replica_id):
            outcome = await wait_idle(
                f"http://{self._config.address}:{spec.port}/metrics",
                engine_key(self._config.node_secret, req.replica_id),
                req.drain_s,
            )
            activity.logger.info("draining %s: %s", req.replica_id, outcome)
        return await asyncio.to_thread(
            self._supervisor.stop, req.replica_id, self._config.stop_grace_s
        )

    # --- for the agent process itself ----------------------------------------------------

    def dead_shards(self) -> list[DeadShard]:
        """Engines that ended while no agent was watching (called at boot, to tell their
        replica workflows)."""
        return [
            DeadShard(workflow_id=spec.workflow_id, exit=self._supervisor.ended_unwatched(spec))
            for spec in self._supervisor.dead_shards()
        ]

    def stop_all_engines(self) -> list[StopResult]:
        return self._supervisor.stop_all(self._config.stop_grace_s)
