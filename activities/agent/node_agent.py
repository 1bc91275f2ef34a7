"""The node agent's Temporal activities: discovery, engine installs, and the life of engine
processes on this machine. Registered by the agent's worker on `node_task_queue(node)`.

What differs between engines (installing one, its commands and environment) is asked of its
adapter (engines/registry.py); what is the same for all of them is here, in engine_launch.py
(starting a shard) and in launch_plan.py (its command line and ports).

Blocking work (subprocesses, builds, /proc scans) runs in threads so the activities can keep
heartbeating; the heartbeat details are what the Temporal UI shows an operator.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.agent import procfs
from activities.agent.adapter_loading import (
    AdapterRefused,
    NoRuntimeAdapters,
    set_adapters,
)
from activities.agent.adopted_adapters import ready_with_adapters, refusal_on_adoption
from activities.agent.config import AgentConfig
from activities.agent.engine_launch import EngineLauncher, not_retryable
from activities.agent.machine_inventory import machine_inventory
from activities.agent.readiness import gpu_memory_problem, query_compute_apps, wait_ready
from activities.agent.supervisor import ReplicaBusy, ShardSpec, ShardSupervisor
from activities.agent.weights import WeightsMissing, adapters_on_node
from engines.metrics import DEFAULT_METRICS_PATH, metrics_path, scrape, wait_idle
from engines.registry import find
from engines.verify import Verification
from workflows.contracts import (
    DiscoverRequest,
    EngineExit,
    EngineInstallRequest,
    EngineLoad,
    EngineLoadReport,
    EngineLoadRequest,
    EngineState,
    EngineStatus,
    LaunchRequest,
    LaunchResult,
    NodeInventory,
    Profile,
    ReadyRequest,
    ReadyResult,
    SetAdaptersRequest,
    SetAdaptersResult,
    ShardRef,
    StopResult,
    VerifyEnginesRequest,
    VerifyEnginesResult,
)
from workflows.engine_keys import engine_key
from workflows.names import NodeActivity

INSTALL_HEARTBEAT_S = 3.0

T = TypeVar("T")
__all__ = ["AgentConfig", "DeadShard", "NodeAgentActivities"]


@dataclass(frozen=True)
class DeadShard:
    """An engine that ended while no agent watched: reported to its replica workflow at boot."""

    workflow_id: str
    exit: EngineExit


class NodeAgentActivities:
    def __init__(
        self,
        config: AgentConfig,
        on_launch: Callable[[], None] | None = None,
        own_ports: Callable[[], set[int]] | None = None,
    ) -> None:
        self._config = config
        # Called (on the event loop) after each engine launch or adoption: the agent's KV
        # subscriptions look at the shards again then, rather than at their next round.
        self._on_launch = on_launch
        # Ports this agent process itself holds (its KV subscribers, on the publishers' ports):
        # held, but not by "another process".
        self._own_ports = own_ports
        self._supervisor = ShardSupervisor(config.agent_dir / "shards", config.agent_dir / "logs")
        # The machine as last discovered: a multi-node shard's NCCL environment comes from it.
        self._inventory: NodeInventory | None = None
        self._launcher = EngineLauncher(config, self._supervisor, self._node_inventory)

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
            self.set_adapters,
        ]

    # --- discovery and installs ----------------------------------------------------------

    @activity.defn(name=NodeActivity.DISCOVER)
    async def discover(self, req: DiscoverRequest) -> NodeInventory:
        if req.node != self._config.node:
            raise not_retryable(
                f"discovery for node {req.node} reached agent {self._config.node}", "WrongNode"
            )
        return await asyncio.to_thread(self.inventory_now)

    def inventory_now(self) -> NodeInventory:
        """The machine now; kept as the latest look (the launcher's and the metrics')."""
        config = self._config
        self._inventory = machine_inventory(
            config.node, config.address, config.artifacts_root, config.metrics_url
        )
        return self._inventory

    @property
    def last_inventory(self) -> NodeInventory | None:
        """The latest look at the machine, None before the first."""
        return self._inventory

    @activity.defn(name=NodeActivity.INSTALL_ENGINE)
    async def install_engine(self, req: EngineInstallRequest) -> EngineStatus:
        requirement = req.requirement
        configured = self._config.engine_paths.get(requirement.engine)
        if requirement.path is None and configured:
            requirement = requirement.model_copy(update={"path": configured})
        latest = [f"installing {requirement.engine} {requirement.version}"]

        def progress(line: str) -> None:
            latest[0] = line  # read by the heartbeat loop below; a list cell is thread-safe

        engine = find(requirement.engine)
        if engine is None:
            return EngineStatus(
                engine=requirement.engine,
                version=requirement.version,
                state=EngineState.FAILED,
                detail=f"engine {requirement.engine} is not supported on this node",
            )

        def install() -> EngineStatus:
            return engine.install(requirement, self._config.install_place, progress)

        return await self._heartbeating(install, lambda: latest[0])

    @activity.defn(name=NodeActivity.VERIFY_ENGINES)
    async def verify_engines(self, req: VerifyEnginesRequest) -> VerifyEnginesResult:
        """Run each installed engine's checks again: an upgrade elsewhere can take a library
        away, and a later failure must be reported, not hidden behind the first success."""
        if req.node != self._config.node:
            raise not_retryable(
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

    def reverify_all(self, engines: list[EngineStatus]) -> list[EngineStatus]:
        """Each engine's status now (blocking): what the liveness watch re-verifies every
        `verify_every_s` and reports only when it differs (activities/agent/liveness.py)."""
        return [self._reverify(status) for status in engines]

    def _reverify(self, status: EngineStatus) -> EngineStatus:
        if status.state not in (EngineState.INSTALLED, EngineState.FAILED) or not status.path:
            return status  # nothing installed to check; the install workflow owns the rest
        engine = find(status.engine)
        if engine is None:
            check = Verification(False, f"engine {status.engine} is not supported on this node")
        else:
            check = engine.reverify(Path(status.path), status.version, self._config.install_place)
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
        return await NodeAgentActivities._heartbeating_async(asyncio.to_thread(work), details)

    @staticmethod
    async def _heartbeating_async(work: Awaitable[T], details: Callable[[], str]) -> T:
        """Await `work`, heartbeating its latest progress until it ends."""
        task = asyncio.ensure_future(work)
        while True:
            activity.heartbeat(details())
            done, _ = await asyncio.wait({task}, timeout=INSTALL_HEARTBEAT_S)
            if done:
                return task.result()

    # --- engine processes ----------------------------------------------------------------

    @activity.defn(name=NodeActivity.START_ENGINE)
    async def start_engine(self, req: LaunchRequest) -> LaunchResult:
        # If this attempt times out, its thread runs on; the retry then waits on the replica's
        # lock and adopts what this one started (ShardSupervisor.launch).
        try:
            own = self._own_ports() if self._own_ports is not None else set()
            launched = await asyncio.to_thread(self._launcher.launch, req, own)
            if launched.adopted:
                launched = await self._load_adopted_adapters(req, own, launched)
        except ReplicaBusy as err:
            raise ApplicationError(str(err), type="ReplicaBusy") from err  # retried
        if self._on_launch is not None:
            self._on_launch()
        return launched

    async def _load_adopted_adapters(
        self, req: LaunchRequest, own_ports: set[int], launched: LaunchResult
    ) -> LaunchResult:
        """An adopted engine that refuses the adapter list it was adopted for is replaced."""
        key = engine_key(self._config.node_secret, req.replica_id)
        refused = await refusal_on_adoption(
            self._supervisor, req.replica_id, self._config.http_base, key
        )
        if refused is None:
            return launched
        activity.logger.warning(
            "%s: the adopted engine did not take its adapters (%s): restarting it",
            req.replica_id,
            refused,
        )
        await asyncio.to_thread(self._supervisor.stop, req.replica_id, self._config.stop_grace_s)
        return await asyncio.to_thread(self._launcher.launch, req, own_ports)

    def _node_inventory(self) -> NodeInventory:
        if self._inventory is None:
            self._inventory = self.inventory_now()
        return self._inventory

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

        # Every engine's Readiness is the same today; a shard's spec does not record its engine,
        # so an engine that differed would need it there first.
        result = await wait_ready(
            req.port,
            engine_key(self._config.node_secret, req.replica_id),
            req.timeout_s,
            heartbeat,
            lambda: self._supervisor.is_alive(req.replica_id),
            poll_s=self._config.ready_poll_s,
            host=self._config.address,
            gpu_check=gpu_check,
        )
        if result.ready:
            result = await self._ready_with_adapters(req, result)
        if not result.ready and not self._supervisor.is_alive(req.replica_id):
            # Why it died, in one redacted line: the replica's status shows it to the operator.
            cause = self._supervisor.failure_line(req.replica_id)
            if cause:
                result = result.model_copy(update={"detail": f"{result.detail}: {cause}"})
        return result

    async def _ready_with_adapters(self, req: ReadyRequest, ready: ReadyResult) -> ReadyResult:
        def heartbeating(load: Awaitable[bool]) -> Awaitable[bool]:
            what = f"loading the adapters {req.replica_id} was adopted for"
            return self._heartbeating_async(load, lambda: what)

        key = engine_key(self._config.node_secret, req.replica_id)
        return await ready_with_adapters(
            self._supervisor, req.replica_id, self._config.http_base, key, ready, heartbeating
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

    def _metrics_url(self, spec: ShardSpec) -> str:
        # trtllm-serve serves its metrics on a path of its own; a spec written before the
        # engine was recorded gets the usual one.
        path = metrics_path(spec.engine) if spec.engine else DEFAULT_METRICS_PATH
        return f"{self._config.http_base(spec.port)}{path}"

    @activity.defn(name=NodeActivity.ENGINE_LOAD)
    async def engine_load(self, req: EngineLoadRequest) -> EngineLoadReport:
        """Each engine's running and waiting requests and token counters, from its metrics
        (asked with its key, which only this agent and the gateway can derive)."""

        async def one(replica_id: str) -> EngineLoad:
            spec = self._supervisor.read_spec(replica_id)
            if spec is None:
                return EngineLoad(replica_id=replica_id, seen=False)
            found = await scrape(
                self._metrics_url(spec),
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

    @activity.defn(name=NodeActivity.SET_ADAPTERS)
    async def set_adapters(self, req: SetAdaptersRequest) -> SetAdaptersResult:
        """Load and unload the running engine's LoRA adapters until it serves exactly those
        asked for, through its runtime endpoints (engines/adapter.py RuntimeAdapters) with its
        key. An adapter from the mirror must have been fetched here first."""
        spec = self._supervisor.read_spec(req.replica_id)
        if spec is None or not self._supervisor.is_alive(req.replica_id):
            raise not_retryable(
                f"replica {req.replica_id} has no running engine on node {self._config.node}",
                "EngineGone",
            )
        engine = find(spec.engine) if spec.engine else None
        runtime = engine.runtime_adapters if engine is not None else None
        if runtime is None:
            raise not_retryable(
                f"engine {spec.engine or 'unknown'} of {req.replica_id} loads adapters only "
                "at launch",
                "NoRuntimeAdapters",
            )
        try:
            lora = adapters_on_node(
                Profile(lora=req.adapters), req.model, self._config.artifacts_root
            ).lora
        except WeightsMissing as err:
            raise not_retryable(f"{err} on node {self._config.node}", "WeightsMissing") from None
        wanted = {adapter.name: adapter.path for adapter in lora}
        try:
            changes = await set_adapters(
                self._config.http_base(spec.port),
                engine_key(self._config.node_secret, req.replica_id),
                runtime,
                wanted,
            )
        except AdapterRefused as err:
            raise not_retryable(f"{req.replica_id}: {err}", "AdapterRefused") from None
        except NoRuntimeAdapters as err:
            raise not_retryable(f"{req.replica_id}: {err}", "NoRuntimeAdapters") from None
        except httpx.HTTPError as err:
            # Retried: the engine may be busy, or restarting (then the retry finds it gone).
            raise ApplicationError(
                f"{req.replica_id}: its engine did not answer ({type(err).__name__})",
                type="EngineUnreachable",
            ) from None
        # What its KV events are hashed with from now on, for a later adoption's route.
        self._supervisor.adapters_served(req.replica_id, spec.pid, wanted)
        activity.logger.info(
            "%s: adapters loaded %s, unloaded %s",
            req.replica_id,
            [name for name, _ in changes.load],
            changes.unload,
        )
        return SetAdaptersResult(
            adapters=wanted,
            loaded=[name for name, _ in changes.load],
            unloaded=changes.unload,
        )

    @activity.defn(name=NodeActivity.STOP_ENGINE)
    async def stop_engine(self, req: ShardRef) -> StopResult:
        spec = self._supervisor.read_spec(req.replica_id) if req.drain_s > 0 else None
        if spec is not None and self._supervisor.is_alive(req.replica_id):
            outcome = await wait_idle(
                self._metrics_url(spec),
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
