"""The pydantic models every workflow, activity, signal, update and query carries.

One model in and one model out per message, so fields can be added later without breaking
running workflows. Secrets never appear in any of these: engine keys are derived where they
are used (see engine_keys.py), API keys live only in the gateway's store.
"""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum

from pydantic import BaseModel, Field

# --- nodes -------------------------------------------------------------------------------


class GpuInfo(BaseModel):
    index: int
    uuid: str
    name: str
    gpu_class: str
    memory_mb: int
    pci_bus_id: str = ""


class NodeInventory(BaseModel):
    """What an agent discovered about its machine."""

    name: str
    address: str = "127.0.0.1"
    hostname: str = ""
    os: str = ""
    kernel: str = ""
    arch: str = ""
    cpu_model: str = ""
    cpu_cores: int = 0
    cpu_flags: list[str] = Field(default_factory=list)
    memory_mb: int = 0
    nvidia_driver: str | None = None
    cuda_version: str | None = None
    gpus: list[GpuInfo] = Field(default_factory=list)


class EngineRequirement(BaseModel):
    """An engine a node should have. `path` names an operator-provided binary to verify instead
    of installing one."""

    engine: str
    version: str
    path: str | None = None


class EngineState(StrEnum):
    INSTALLING = "installing"
    INSTALLED = "installed"
    FAILED = "failed"


class EngineStatus(BaseModel):
    engine: str
    version: str
    state: EngineState
    path: str | None = None
    # What the install saw: the engine's own --version line when installed, the reason otherwise.
    detail: str = ""


class NodeState(StrEnum):
    REGISTERING = "registering"
    READY = "ready"
    LOST = "lost"


class NodeRecord(BaseModel):
    """A node as the ledger and `llmgw nodes` see it."""

    inventory: NodeInventory
    state: NodeState = NodeState.REGISTERING
    engines: dict[str, EngineStatus] = Field(default_factory=dict)
    cordoned: bool = False
    port_min: int = 18000
    port_max: int = 18999


class NodeRegistration(BaseModel):
    """The agent's `register` update on its node workflow."""

    inventory: NodeInventory
    boot_id: str
    engines: list[EngineRequirement] = Field(default_factory=list)


class NodeHeartbeat(BaseModel):
    boot_id: str


class NodeView(BaseModel):
    record: NodeRecord
    boot_id: str = ""


# --- engine installs ---------------------------------------------------------------------


class EngineInstallRequest(BaseModel):
    node: str
    requirement: EngineRequirement


# --- models ------------------------------------------------------------------------------


class ModelSpec(BaseModel):
    """A model as declared by the operator. Everything but `replicas` is the profile whose
    fingerprint says whether a running replica is current."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")
    engine: str = "llamacpp"
    engine_version: str = ""
    weights: str
    replicas: int = Field(default=1, ge=0, le=64)
    cpu_cores: int = Field(default=2, ge=1)
    memory_mb: int = Field(default=1024, ge=64)
    context_size: int = Field(default=4096, ge=256)
    parallel: int = Field(default=2, ge=1, le=64)
    args: list[str] = Field(default_factory=list)

    def fingerprint(self) -> str:
        profile = self.model_dump(exclude={"replicas"})
        blob = json.dumps(profile, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


class ScaleRequest(BaseModel):
    replicas: int = Field(ge=0, le=64)


class RemoveModel(BaseModel):
    reason: str = "removed by operator"


class ModelView(BaseModel):
    spec: ModelSpec
    replica_ids: list[str] = Field(default_factory=list)
    removing: bool = False


class ModelState(BaseModel):
    """The model workflow's whole state, carried through continue-as-new."""

    spec: ModelSpec
    removing: bool = False
    next_index: int = 0
    indices: list[int] = Field(default_factory=list)


# --- replicas ----------------------------------------------------------------------------


class ReplicaState(StrEnum):
    PENDING = "pending"  # waiting for a node that can take it
    STARTING = "starting"  # placed; engine process being launched
    LOADING = "loading"  # process up, weights loading (/health or /v1/models not yet OK)
    READY = "ready"  # serving: the only state the gateway routes to
    RESTARTING = "restarting"  # engine exited; waiting out the backoff before starting again
    STOPPING = "stopping"  # draining and stopping on scale-down or removal
    STOPPED = "stopped"  # gone; its resources are released

    @classmethod
    def routable(cls) -> frozenset[ReplicaState]:
        return frozenset({cls.READY})


class ReplicaInput(BaseModel):
    replica_id: str
    model: ModelSpec


class StopReplica(BaseModel):
    reason: str = "scaled down"


class EngineExit(BaseModel):
    """An engine process ended (or was found gone). Sent as the supervise activity's result and,
    when an agent restarts and finds a shard dead, as a signal to the replica workflow."""

    replica_id: str
    exit_code: int | None = None
    reason: str = ""
    log_tail: str = ""


class ReplicaView(BaseModel):
    replica_id: str
    model: str
    state: ReplicaState
    node: str | None = None
    restarts: int = 0
    detail: str = ""


# --- ledger ------------------------------------------------------------------------------


class PlacementRequest(BaseModel):
    replica_id: str
    model: str
    engine: str
    engine_version: str
    cpu_cores: int
    memory_mb: int


class Allocation(BaseModel):
    replica_id: str
    node: str
    address: str
    port: int
    cpu_cores: int
    memory_mb: int


class PlacementRefused(BaseModel):
    """Why a replica could not be placed: one line per node, in the node's own words."""

    replica_id: str
    reasons: dict[str, str]


class ReleaseRequest(BaseModel):
    replica_id: str


class Route(BaseModel):
    replica_id: str
    model: str
    node: str
    endpoint: str
    engine: str
    state: ReplicaState
    fingerprint: str = ""
    detail: str = ""


class RoutingTable(BaseModel):
    # Bumped on every change, so a gateway can tell whether anything moved.
    version: int = 0
    routes: list[Route] = Field(default_factory=list)


class LedgerState(BaseModel):
    """The cluster ledger's whole state: carried through continue-as-new, so kept compact."""

    nodes: dict[str, NodeRecord] = Field(default_factory=dict)
    allocations: dict[str, Allocation] = Field(default_factory=dict)
    routes: dict[str, Route] = Field(default_factory=dict)
    version: int = 0


class LedgerAck(BaseModel):
    version: int


# --- node agent activities -------------------------------------------------------------


class DiscoverRequest(BaseModel):
    node: str


class LaunchRequest(BaseModel):
    """Start (or adopt) one engine process for a replica on this node."""

    replica_id: str
    workflow_id: str
    model: ModelSpec
    allocation: Allocation


class LaunchResult(BaseModel):
    pid: int
    adopted: bool
    command: list[str]


class ReadyRequest(BaseModel):
    replica_id: str
    port: int
    timeout_s: float = 600.0


class ReadyResult(BaseModel):
    ready: bool
    detail: str = ""


class ShardRef(BaseModel):
    replica_id: str


class StopResult(BaseModel):
    replica_id: str
    was_running: bool
