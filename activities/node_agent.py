"""The node agent's Temporal activities: discovery, engine installs, and the life of engine
processes on this machine. Registered by the agent's worker on `node_task_queue(node)`.

Blocking work (subprocesses, builds, /proc scans) runs in threads so the activities can keep
heartbeating; the heartbeat details are what the Temporal UI shows an operator.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.discovery import discover_inventory
from activities.engine_drain import wait_idle
from activities.engines import vllm
from activities.engines.install_llamacpp import (
    install_llamacpp,
    installed_binary,
    nvidia_driver_loaded,
)
from activities.engines.llamacpp import ENGINE as LLAMACPP
from activities.engines.llamacpp import LLAMACPP_DEFAULT_VERSION, command_line, engine_env
from activities.engines.python_env import env_is_cpu_build, install_python_engine
from activities.engines.python_env import reverify as reverify_python_env
from activities.engines.trtllm import check_trtllm
from activities.engines.verify import Verification, verify_llamacpp
from activities.readiness import wait_ready
from activities.supervisor import ShardSupervisor
from workflows.contracts import (
    DiscoverRequest,
    EngineExit,
    EngineInstallRequest,
    EngineRequirement,
    EngineState,
    EngineStatus,
    LaunchRequest,
    LaunchResult,
    NodeInventory,
    ReadyRequest,
    ReadyResult,
    ShardRef,
    StopResult,
    VerifyEnginesRequest,
    VerifyEnginesResult,
)
from workflows.engine_keys import engine_key
from workflows.engine_plan import SGLANG, TRTLLM, VLLM
from workflows.names import NodeActivity

# Only these reach an engine from the agent's environment; the key is added explicitly. Anything
# else the agent holds (credentials, the node secret's source) stays out of engine processes.
INHERITED_ENV = ("PATH", "HOME", "LANG")
INSTALL_HEARTBEAT_S = 3.0

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


def _not_retryable(message: str, kind: str) -> ApplicationError:
    return ApplicationError(message, type=kind, non_retryable=True)


class NodeAgentActivities:
    def __init__(self, config: AgentConfig) -> None:
        self._config = config
        self._supervisor = ShardSupervisor(config.agent_dir / "shards", config.agent_dir / "logs")

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
        ]

    # --- discovery and installs ----------------------------------------------------------

    @activity.defn(name=NodeActivity.DISCOVER)
    async def discover(self, req: DiscoverRequest) -> NodeInventory:
        if req.node != self._config.node:
            raise _not_retryable(
                f"discovery for node {req.node} reached agent {self._config.node}", "WrongNode"
            )
        return await asyncio.to_thread(discover_inventory, self._config.node, self._config.address)

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
        if status.state is not EngineState.INSTALLED:
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
            update={"detail": "; ".join((check.detail, *check.notes)), "verified_at": now}
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
        return await asyncio.to_thread(self._launch, req)

    def _launch(self, req: LaunchRequest) -> LaunchResult:
        model = req.model
        if model.engine not in (LLAMACPP, VLLM):
            raise _not_retryable(
                f"engine {model.engine} is not supported on this node yet", "EngineNotSupported"
            )
        version = model.engine_version or (
            LLAMACPP_DEFAULT_VERSION if model.engine == LLAMACPP else ""
        )
        if not version:
            raise _not_retryable(
                f"model {model.name}: engine_version is required for {model.engine}",
                "InvalidModelArgs",
            )
        binary = self._binary(model.engine, version)
        if not Path(model.weights).exists():
            raise _not_retryable(
                f"weights {model.weights} for model {model.name} not found on node "
                f"{self._config.node}",
                "WeightsMissing",
            )
        key = engine_key(self._config.node_secret, req.replica_id)
        address, port, cores = self._config.address, req.allocation.port, req.allocation.cpu_cores
        try:
            if model.engine == VLLM:
                cpu = not self._config.has_nvidia
                command = vllm.command_line(str(binary), model, address, port, cpu=cpu)
                env = self._engine_env(vllm.engine_env(key, model, cpu=cpu))
            else:
                command = command_line(str(binary), model, address, port, cores)
                env = self._engine_env(engine_env(key))
        except ValueError as err:
            raise _not_retryable(str(err), "InvalidModelArgs") from err
        port = req.allocation.port
        if not self._supervisor.is_alive(req.replica_id) and not port_free(
            self._config.address, port
        ):
            # Something outside llmgw holds the port: the engine would fail to bind, and the
            # readiness probe would knock on the stranger's door.
            raise _not_retryable(
                f"port {port} on node {self._config.node} is in use by another process",
                "PortInUse",
            )
        return self._supervisor.launch(
            req.replica_id,
            req.workflow_id,
            command,
            env,
            model.fingerprint(),
            req.allocation.port,
        )

    @activity.defn(name=NodeActivity.WAIT_READY)
    async def wait_ready(self, req: ReadyRequest) -> ReadyResult:
        def heartbeat() -> None:
            activity.heartbeat(f"waiting for {req.replica_id} on port {req.port} to load")

        return await wait_ready(
            req.port,
            engine_key(self._config.node_secret, req.replica_id),
            req.timeout_s,
            heartbeat,
            lambda: self._supervisor.is_alive(req.replica_id),
            poll_s=self._config.ready_poll_s,
            host=self._config.address,
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
            DeadShard(
                workflow_id=spec.workflow_id,
                exit=EngineExit(
                    replica_id=spec.replica_id,
                    reason=f"engine process {spec.pid} ended while the agent was not running",
                    log_tail=self._supervisor.log_tail(spec.replica_id),
                ),
            )
            for spec in self._supervisor.dead_shards()
        ]

    def stop_all_engines(self) -> list[StopResult]:
        return self._supervisor.stop_all(self._config.stop_grace_s)
