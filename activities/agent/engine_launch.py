"""How the node agent starts an engine's shard (NodeAgentActivities.start_engine): the shard
this node runs, the engine's binary, weights and adapters on this node, its command line and
environment (secrets resolved last, never logged or returned), a check that every port it binds
is free, and the supervisor's launch or adoption. Blocking: the activity runs it in a thread.

What differs between engines is asked of its adapter (engines/registry.py); the command line is
assembled in launch_plan.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.agent.config import AgentConfig
from activities.agent.launch_plan import launch_argv, port_free, shard_ports
from activities.agent.node_secrets import SecretMissing, SecretUnsafe, resolve_env
from activities.agent.supervisor import ShardSupervisor
from activities.agent.weights import WeightsMissing, adapters_on_node, weights_on_node
from engines.adapter import Engine, KvPublisher, ShardLaunch
from engines.commands import ShardPlace
from engines.engine_dir import installed_binary
from engines.registry import find
from engines.shard_env import shard_env
from workflows import otel
from workflows.contracts import (
    KvSource,
    LaunchRequest,
    LaunchResult,
    NodeInventory,
    PortsInUse,
    Profile,
    ShardAllocation,
)
from workflows.engine_keys import engine_key
from workflows.placement.ports import RENDEZVOUS

# Only these reach an engine from the agent's environment; the key is added explicitly. Anything
# else the agent holds (credentials, the node secret's source) stays out of engine processes.
INHERITED_ENV = ("PATH", "HOME", "LANG")


def not_retryable(message: str, kind: str) -> ApplicationError:
    return ApplicationError(message, type=kind, non_retryable=True)


class EngineLauncher:
    def __init__(
        self,
        config: AgentConfig,
        supervisor: ShardSupervisor,
        inventory: Callable[[], NodeInventory],
    ) -> None:
        """`inventory`: the machine as last discovered (a multi-node shard's NCCL environment
        comes from it)."""
        self._config = config
        self._supervisor = supervisor
        self._inventory = inventory

    def _binary(self, engine: str, version: str) -> Path:
        configured = self._config.engine_paths.get(engine)
        if configured:
            path = Path(configured)
            # A Python engine's operator path may name its environment rather than its script.
            return path / "bin" / engine if path.is_dir() else path
        binary = installed_binary(self._config.engines_root, engine, version)
        if binary is None:
            raise not_retryable(
                f"engine {engine} {version} is not installed on node {self._config.node}",
                "EngineNotInstalled",
            )
        return binary

    def _engine_env(self, extra: dict[str, str]) -> dict[str, str]:
        env = {name: os.environ[name] for name in INHERITED_ENV if name in os.environ}
        env.update(extra)
        return env

    def _my_shard(self, req: LaunchRequest) -> tuple[Profile, list[ShardAllocation], int]:
        """The profile the replica was placed with, every shard, and this node's rank."""
        model, alloc = req.model, req.allocation
        if not 0 <= alloc.profile_index < len(model.profiles):
            raise not_retryable(
                f"model {model.name} has no profile {alloc.profile_index}", "InvalidModelArgs"
            )
        shards = alloc.shards_or_leader()
        for rank, shard in enumerate(shards):
            if shard.node == self._config.node:
                return model.profiles[alloc.profile_index], shards, rank
        raise not_retryable(
            f"replica {req.replica_id} has no shard on node {self._config.node}", "WrongNode"
        )

    def _runnable(self, name: str) -> Engine:
        """The adapter of an engine this agent launches; EngineNotSupported for a name llmgw
        has no adapter for, and for an engine served outside llmgw."""
        engine = find(name)
        if engine is None or not engine.runs_on_nodes:
            raise not_retryable(
                f"engine {name} is not supported on this node yet", "EngineNotSupported"
            )
        return engine

    def launch(self, req: LaunchRequest, own_ports: set[int]) -> LaunchResult:
        """Start this node's shard of the replica (or adopt the engine already running it), in a
        thread: it runs subprocesses and reads files. `own_ports`: ports the agent itself holds,
        not counted as taken."""
        model = req.model
        profile, shards, rank = self._my_shard(req)
        engine = self._runnable(profile.engine)
        version = profile.engine_version or engine.default_version
        if not version:
            raise not_retryable(
                f"model {model.name}: engine_version is required for {engine.name}",
                "InvalidModelArgs",
            )
        binary = self._binary(engine.name, version)
        try:
            weights = weights_on_node(model, self._config.artifacts_root)
            profile = adapters_on_node(profile, model.name, self._config.artifacts_root)
        except WeightsMissing as err:
            raise not_retryable(f"{err} on node {self._config.node}", "WeightsMissing") from None
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
            traces_url=otel.current_traces_url(),
        )
        try:
            commands, own_env = engine.commands(launch), engine.environment(launch)
            extra = shard_env(
                gpu_uuids=list(shard.gpu_uuids),
                profile_env=profile.env,
                nodes=len(shards),
                fabric=req.allocation.fabric,
                inventory=self._inventory() if len(shards) > 1 else None,
            )
        except ValueError as err:
            raise not_retryable(str(err), "InvalidModelArgs") from err
        for name, reason in sorted(extra.dropped.items()):
            # Refused when the model was defined; dropped again whatever sent the profile.
            activity.logger.warning("model %s: env %s dropped, %s", model.name, name, reason)
        try:
            # Secrets last, after the policy: a value read here is never logged or returned.
            resolved = resolve_env(extra.env, self._config.secrets_dir)
        except (SecretMissing, SecretUnsafe) as err:
            raise not_retryable(
                f"model {model.name} on node {self._config.node}: {err} (set it there with "
                "`llmgw secret set NAME`)",
                type(err).__name__,
            ) from None
        env = self._engine_env({**own_env, **resolved})

        # Recorded in the shard's spec, for this agent's subscriber (kv/subscriptions.py).
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
        return launched.model_copy(update={"kv": self.kv_source(self._recorded_publisher(req))})

    def _recorded_publisher(self, req: LaunchRequest) -> KvPublisher | None:
        """What the spec recorded: for an adopted engine, the publisher it was started with,
        with the adapters it was adopted for (it serves them before it is reported ready)."""
        recorded = self._supervisor.read_spec(req.replica_id)
        publisher = recorded.publisher() if recorded else None
        if publisher is None or recorded is None or recorded.pending_adapters is None:
            return publisher
        return replace(publisher, adapters=tuple(recorded.pending_adapters.items()))

    def kv_source(self, publisher: KvPublisher | None) -> KvSource | None:
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
