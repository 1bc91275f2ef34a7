"""What llmgw does with an engine, as one interface every engine implements.

An adapter holds its engine's machinery: how it is installed and checked again later, the
commands and environment one shard of a replica runs with, where it publishes KV-cache events,
and how it loads LoRA adapters while it runs. What is known of the engine as plain facts (what
says it is ready, its metric names and path, whether it publishes KV-cache events, its default
version) is its row in workflows/contracts/engine_facts.py, which the adapter reads back
(`facts`) rather than keeping a copy. The node agent and engines/metrics.py ask the registry
(engines/registry.py) for an adapter by name instead of telling engines apart themselves;
adding an engine is one module holding its adapter, registered there, and its row.

engines/ imports nothing from activities/, gateway/ or workers/, which all sit above it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from engines.commands import Command, ShardPlace
from engines.verify import Verification
from workflows.contracts import (
    EngineFacts,
    EngineRequirement,
    EngineStatus,
    ModelSpec,
    Profile,
    engine_facts,
)

# Re-exported: adapters and the agent take these from here.
from workflows.contracts import MetricNames as MetricNames
from workflows.contracts import Readiness as Readiness

# Called with each line of an install's progress (the agent heartbeats the latest).
Progress = Callable[[str], None]


@dataclass(frozen=True)
class InstallPlace:
    """Where an install goes on this node, and what the node has."""

    engines_root: Path  # <root>/<engine>/<version>/ holds each installed version
    cache_dir: Path  # downloads and builds, kept across installs
    nvidia: bool  # an NVIDIA driver is loaded here: install and check the CUDA build
    # The operator consents to installing a library an engine lacks from the node's own
    # package sources (engines/os_packages.py; `llmgw agent --install-os-packages`).
    os_packages: bool = False


@dataclass(frozen=True)
class RuntimeAdapters:
    """How a running engine loads and unloads LoRA adapters (activities/agent/adapter_loading.py
    does it, with the engine key): POST `load` {"lora_name", "lora_path"}, POST `unload`
    {"lora_name"}, and `listing` (an OpenAI model list) names each adapter served, with its
    path as `root` and the base model as `parent`. The engine offers them only when started
    with `enable_env` in its environment (the adapter's environment() sets it)."""

    load: str
    unload: str
    listing: str
    enable_env: tuple[str, str]


@dataclass(frozen=True)
class KvPublisher:
    """Where a shard publishes its KV-cache events on its node, and how it hashes blocks.
    Both endpoints are on loopback: nothing beyond the node can reach an engine's sockets."""

    endpoint: str  # the agent's subscriber binds it; the engine's PUB socket connects
    replay_endpoint: str  # the engine's replay ROUTER binds it; the subscriber asks there
    topic: str
    block_size: int  # tokens a block
    hash_seed: str | None  # the engine's PYTHONHASHSEED; None when unset
    # The LoRA adapters the engine loaded, (name, path) as its command line gave them: vLLM
    # hashes ("lora", name, path) into every block of an adapter's request.
    adapters: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        # A spec file read back gives lists: kept as tuples, so a recorded publisher equals the
        # one it was made from.
        object.__setattr__(self, "adapters", tuple((str(n), str(p)) for n, p in self.adapters))


@dataclass(frozen=True)
class ShardLaunch:
    """What one shard's commands and environment are made from."""

    replica_id: str
    model: ModelSpec
    profile: Profile  # the profile the replica was placed with
    place: ShardPlace
    # The ports this shard uses besides its HTTP port, by placement's names
    # (workflows/placement/ports.py): the leader's rendezvous point, vLLM's KV-event ports,
    # trtllm-serve's loopback port behind its key guard.
    ports: Mapping[str, int]
    # The installed (or operator-provided) entry point: a binary, or a script in the engine's
    # virtual environment.
    binary: Path
    key: str = ""  # the engine key; it goes in the environment, never on a command line
    nvidia: bool = False  # an NVIDIA driver is loaded on this node
    # The OTLP/HTTP traces URL the agent sends its spans to; "" when it does not trace. An
    # engine that traces itself is pointed there (vLLM: --otlp-traces-endpoint).
    traces_url: str = ""


class NotRunByLlmgwError(ValueError):
    """Asked to install or launch an engine llmgw does not run (an external model's)."""


class Engine(ABC):
    """One engine, as llmgw runs it. Instances hold no state: the registry keeps one each."""

    # Its row's name in workflows/contracts/engine_facts.py.
    name: ClassVar[str]
    # How it loads and unloads LoRA adapters while it runs; None: its adapters are given at
    # launch, and a changed list restarts the replica (its row's lora_at_runtime agrees).
    runtime_adapters: ClassVar[RuntimeAdapters | None] = None

    @property
    def facts(self) -> EngineFacts:
        """The engine's row; every adapter has one (tests/unit/test_engine_facts.py)."""
        found = engine_facts(self.name)
        if found is None:
            raise LookupError(f"engine {self.name} has no row in ENGINE_FACTS")
        return found

    @property
    def default_version(self) -> str:
        """The version a profile that names none gets; "" when the profile must name one."""
        return self.facts.default_version

    @property
    def runs_on_nodes(self) -> bool:
        """False for an engine served outside llmgw: nothing is installed, placed or launched."""
        return self.facts.runs_on_nodes

    @property
    def metrics(self) -> MetricNames | None:
        """None when llmgw does not read the engine's metrics."""
        return self.facts.metrics

    @property
    def readiness(self) -> Readiness:
        return self.facts.readiness

    @property
    def kv_events(self) -> bool:
        """Whether it publishes KV-cache events the router can subscribe to."""
        return self.facts.kv_events

    @abstractmethod
    def install(
        self, req: EngineRequirement, where: InstallPlace, progress: Progress
    ) -> EngineStatus:
        """Install (or check the operator's copy named by `req.path`), in a thread: blocking.
        A failure the same attempt would repeat is a FAILED status; a transient one raises."""

    @abstractmethod
    def reverify(self, path: Path, version: str, where: InstallPlace) -> Verification:
        """Check that an installed engine (`path`, as its install reported it) still runs."""

    @abstractmethod
    def commands(self, shard: ShardLaunch) -> list[Command]:
        """This shard's commands, sidecars first. Raises ValueError for a profile the engine
        cannot run (an operator arg taking over a flag llmgw sets, say)."""

    @abstractmethod
    def environment(self, shard: ShardLaunch) -> dict[str, str]:
        """The engine's own environment for this shard (its key included); the agent adds the
        shard's GPUs, NCCL and the profile's env (engines/shard_env.py)."""

    def kv_publisher(self, shard: ShardLaunch) -> KvPublisher | None:
        """Where this shard publishes KV-cache events; None when it publishes none."""
        del shard
        return None
