"""The node agent's Temporal activities: discovery, engine installs, and the life of engine
processes on this machine. Registered by the agent's worker on `node_task_queue(node)`.

What differs between engines (installing one, its commands and environment) is asked of its
adapter (engines/registry.py); what is the same for all of them is here and in launch_plan.py.

Blocking work (subprocesses, builds, /proc scans) runs in threads so the activities can keep
heartbeating; the heartbeat details are what the Temporal UI shows an operator.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
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
from activities.agent.artifact_store import ArtifactStore
from activities.agent.config import AgentConfig
from activities.agent.discovery import discover_inventory
from activities.agent.launch_plan import launch_argv, port_free, shard_ports
from activities.agent.node_secrets import SecretMissing, SecretUnsafe, resolve_env
from activities.agent.readiness import gpu_memory_problem, query_compute_apps, wait_ready
from activities.agent.supervisor import ReplicaBusy, ShardSpec, ShardSupervisor
from activities.agent.weights import WeightsMissing, adapters_on_node, weights_on_node
from engines.adapter import Engine, KvPublisher, ShardLaunch
from engines.commands import ShardPlace
from engines.engine_dir import installed_binary
from engines.metrics import DEFAULT_METRICS_PATH, metrics_path, scrape, wait_idle
from engines.registry import find
from engines.shard_env import shard_env
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
    KvSource,
    LaunchRequest,
    LaunchResult,
    NodeInventory,
    PortsInUse,
    Profile,
    ReadyRequest,
    ReadyResult,
    SetAdaptersRequest,
    SetAdaptersResult,
    ShardAllocation,
    ShardRef,
    StopResult,
    VerifyEnginesRequest,
    VerifyEnginesResult,
)
from workflows.engine_keys import engine_key
from workflows.names import NodeActivity
from workflows.placement.ports import RENDEZVOUS

# Only these reach an engine from the agent's environment; the key is added explicitly. Anything
# else the agent holds (credentials, the node secret's source) stays out of engine processes.
INHERITED_ENV = ("PATH", "HOME", "LANG")
INSTALL_HEARTBEAT_S = 3.0

T = TypeVar("T")
__all__ = ["AgentConfig", "DeadShard", "NodeAgentActivities"]


@dataclass(frozen=True)
class DeadShard:
    """An engine that ended while no agent watched: reported to its replica workflow at boot."""

    workflow_id: str
    exit: EngineExit


def _not_retryable(message: str, kind: str) -> ApplicationError:
    return ApplicationError(message, type=kind, non_retryable=True)


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
            raise _not_retryable(
                f"discovery for node {req.node} reached agent {self._config.node}", "WrongNode"
            )
        inventory = await asyncio.to_thread(self.inventory_now)
        self._inventory = inventory
        return inventory

    def inventory_now(self) -> NodeInventory:
        """This machine as discovery sees it, with the artifacts it holds and room for more."""
        inventory = discover_inventory(self._config.node, self._config.address)
        store = ArtifactStore(self._config.artifacts_root)
        held = {
            "artifacts": store.complete(),
            "artifact_disk_free_mb": store.disk_free_mb(),
            "metrics_url": self._config.metrics_url,
        }
        return inventory.model_copy(update=held)

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
            own = self._own_ports() if self._own_ports is not None else set()
            launched = await asyncio.to_thread(self._launch, req, own)
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
        return await asyncio.to_thread(self._launch, req, own_ports)

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
            self._inventory = self.inventory_now()
        return self._inventory

    def _runnable(self, name: str) -> Engine:
        """The adapter of an engine this agent launches; EngineNotSupported for a name llmgw
        has no adapter for, and for an engine served outside llmgw."""
        engine = find(name)
        if engine is None or not engine.runs_on_nodes:
            raise _not_retryable(
                f"engine {name} is not supported on this node yet", "EngineNotSupported"
            )
        return engine

    def _launch(self, req: LaunchRequest, own_ports: set[int]) -> LaunchResult:
        model = req.model
        profile, shards, rank = self._my_shard(req)
        engine = self._runnable(profile.engine)
        version = profile.engine_version or engine.default_version
        if not version:
            raise _not_retryable(
                f"model {model.name}: engine_version is required for {engine.name}",
                "InvalidModelArgs",
            )
        binary = self._binary(engine.name, version)
        try:
            weights = weights_on_node(model, self._config.artifacts_root)
            profile = adapters_on_node(profile, model.name, self._config.artifacts_root)
        except WeightsMissing as err:
            raise _not_retryable(f"{err} on node {self._config.node}", "WeightsMissing") from None
        model = model.model_copy(update={"weights": str(weights)})
        shard, leader = shards[rank], shards[0]
        ports = shard_ports(shard, leader, profile, rank)
        place = ShardPlace(
            address=self._config.address,
            port=shard.port,
            rank=rank,
            nodes=len(shards),
            leader_address=leader.address,
            rendezvous_port=ports.by_name.get(RENDEZVOUS, 0),  # 0: one node, none needed
            gpus=list(shard.gpu_uuids),
            cpu_cores=shard.cpu_cores,
        )
        launch = ShardLaunch(
            replica_id=req.replica_id,
            model=model,
            profile=profile,
            place=place,
            ports=ports.by_name,
            binary=binary,
            key=engine_key(self._config.node_secret, req.replica_id),
            nvidia=self._config.has_nvidia,
        )
        try:
            commands, own_env = engine.commands(launch), engine.environment(launch)
            extra = shard_env(
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

        # Recorded in the shard's spec, for this agent's subscriber (kv_subscriptions.py).
        publisher = engine.kv_publisher(launch)

        # Checked only when an engine is really started (not on an adoption), under the
        # replica's lock: every port this shard binds must be free.
        def ports_free() -> None:
            held = [
                p
                for p in ports.binds
                if p not in own_ports and not port_free(ports.host_of(p, self._config.address), p)
            ]
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

        # An engine that loads adapters while it runs is adopted when only its adapters
        # changed; its leader (which serves the API) then loads this list.
        runtime = engine.runtime_adapters is not None
        index = req.allocation.profile_index
        launched = self._supervisor.launch(
            req.replica_id,
            req.workflow_id,
            launch_argv(commands),
            env,
            model.profile_fingerprint(index),
            shard.port,
            gpu_uuids=list(shard.gpu_uuids),
            before_start=ports_free,
            engine=engine.name,
            kv_publisher=publisher,
            restart_fingerprint=model.restart_fingerprint(index) if runtime else "",
            adapters={a.name: a.path for a in profile.lora} if runtime and rank == 0 else None,
        )
        return launched.model_copy(update={"kv": self._kv_source(self._recorded_publisher(req))})

    def _recorded_publisher(self, req: LaunchRequest) -> KvPublisher | None:
        """What the spec recorded: for an adopted engine, the publisher it was started with,
        with the adapters it was adopted for (it serves them before it is reported ready)."""
        recorded = self._supervisor.read_spec(req.replica_id)
        publisher = recorded.publisher() if recorded else None
        if publisher is None or recorded is None or recorded.pending_adapters is None:
            return publisher
        return replace(publisher, adapters=tuple(recorded.pending_adapters.items()))

    def _kv_source(self, publisher: KvPublisher | None) -> KvSource | None:
        """Where gateways learn what the engine caches: this agent's feed, when it has one."""
        port = self._config.kv_feed_port
        if publisher is None or port <= 0:
            return None
        return KvSource(
            feed=self._config.http_base(port),
            block_size=publisher.block_size,
            hash_seed=publisher.hash_seed,
            adapters=dict(publisher.adapters),
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
            raise _not_retryable(
                f"replica {req.replica_id} has no running engine on node {self._config.node}",
                "EngineGone",
            )
        engine = find(spec.engine) if spec.engine else None
        runtime = engine.runtime_adapters if engine is not None else None
        if runtime is None:
            raise _not_retryable(
                f"engine {spec.engine or 'unknown'} of {req.replica_id} loads adapters only "
                "at launch",
                "NoRuntimeAdapters",
            )
        try:
            lora = adapters_on_node(
                Profile(lora=req.adapters), req.model, self._config.artifacts_root
            ).lora
        except WeightsMissing as err:
            raise _not_retryable(f"{err} on node {self._config.node}", "WeightsMissing") from None
        wanted = {adapter.name: adapter.path for adapter in lora}
        try:
            changes = await set_adapters(
                self._config.http_base(spec.port),
                engine_key(self._config.node_secret, req.replica_id),
                runtime,
                wanted,
            )
        except AdapterRefused as err:
            raise _not_retryable(f"{req.replica_id}: {err}", "AdapterRefused") from None
        except NoRuntimeAdapters as err:
            raise _not_retryable(f"{req.replica_id}: {err}", "NoRuntimeAdapters") from None
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
