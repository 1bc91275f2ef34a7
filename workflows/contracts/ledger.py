"""The ledger: placement, allocations, routes and the cluster ledger's state."""

from __future__ import annotations

from pydantic import BaseModel, Field

from workflows.contracts.models import Profile
from workflows.contracts.nodes import NodeRecord, NodeState
from workflows.contracts.replicas import ReplicaState


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
    # The model's weights in the mirror (ModelSpec.artifact): nodes holding them come first.
    artifact: str = ""
    # Its size in bytes (ModelSpec.artifact_size): a node that must fetch it needs the space.
    # 0: not known, so no node is refused for space.
    artifact_size: int = Field(default=0, ge=0)


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


class KvSource(BaseModel):
    """Where a gateway learns which prefix-cache blocks a replica holds, and how to hash a
    request's tokens the way its engine does (engines/kv_hashes.py)."""

    # The node agent's KV feed (engines/kv_feed.py), "http://address:port"; "" for an
    # external engine, whose own publisher the gateway subscribes to (`publisher`).
    feed: str = ""
    block_size: int
    # The engine's PYTHONHASHSEED (its hashes' seed); None when it has none.
    hash_seed: str | None = None
    # The engine's LoRA adapters, name to path as its command line gave them: vLLM keys every
    # block of an adapter's request by ("lora", name, path) (gateway/routing/kv_blocks.py).
    adapters: dict[str, str] = Field(default_factory=dict)
    # External engines only (Profile.external_kv): the engine's ZMQ publisher, its replay
    # socket ("" = none) and topic, which each gateway connects to (gateway/kv_publishers.py).
    publisher: str = ""
    replay: str = ""
    topic: str = ""


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
    # Engines that publish KV-cache events (vLLM with a profile's kv_events): routed by the
    # blocks they report holding. None: by the gateway's own prefix index.
    kv: KvSource | None = None
    # llama.cpp started with `--cache-ram 0`: its slots, which are then its whole prompt cache
    # (the gateway replays their choice: gateway/routing/slot_cache.py). None: any other engine.
    prompt_slots: int | None = None
    # The replica's LoRA adapters by name, in its profile's `lora` order: the order of
    # llama-server's --lora flags, whose index a request's `lora` field names the adapter by
    # (gateway/lora.py). Also listed by /v1/models. Empty on a route published before this field.
    adapters: list[str] = Field(default_factory=list)


class RoutingTable(BaseModel):
    """The ledger's answer to a gateway: the whole table (a legacy asker), one page of it, the
    routes that changed since the asker's version (a delta), or that nothing did."""

    # Bumped on every change to the ledger, so a gateway can tell whether anything moved.
    version: int = 0
    routes: list[Route] = Field(default_factory=list)
    # Models scaled to zero that a request wakes: the gateway holds the request meanwhile.
    idle_models: list[str] = Field(default_factory=list)
    # The ledger's first run id: versions count within one ledger, and a ledger started afresh
    # begins again at 0, so a version alone could match a table it never had.
    epoch: str = ""
    # No route changed since the asker's version: no routes are sent. To an asker that takes
    # deltas, `version` may be newer than its own (a placement moved the ledger, no route).
    unchanged: bool = False
    # The routes that changed since `since` (the asker's version): `routes` replace the
    # asker's by replica id, `removed` are gone. False: `routes` are (a page of) the table.
    delta: bool = False
    since: int = -1
    removed: list[str] = Field(default_factory=list)
    # A page of the whole table, by replica id: "" on the last page, else the id to ask for
    # the next page after (RoutingTableRequest.after). A whole table at 40,000 routes is about
    # 9 MB, past Temporal's 4 MB query answer; a page stays near 200 KB.
    next_after: str = ""
    # How many ledger cells the cluster has (workflows/ledger_cells.py), as the first cell
    # answers: a gateway reads the routes of every cell and merges them.
    cells: int = 1


class RoutingTableRequest(BaseModel):
    """What the asking gateway already holds; the defaults hold nothing. An asker that leaves
    `deltas` False (a gateway from before them) is sent the whole table in one answer."""

    epoch: str = ""
    version: int = -1
    # The asker applies deltas and pages (gateway/route_book.py).
    deltas: bool = False
    # Asking for the page of the whole table after this replica id (the last answer's
    # next_after); "" for a first page or a delta.
    after: str = ""


class RouteChange(BaseModel):
    """One entry of the ledger's route log: at `version`, this replica's route changed, or
    every route on this node (its state, which gateways see routes through, changed), or with
    neither the idle models changed."""

    version: int
    replica_id: str = ""
    node: str = ""


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
    # What changed gateways' routes lately, oldest first, bounded (workflows/route_log.py); and
    # the version from which it is complete (an asker at an older one gets the whole table).
    # None in a state from before the log: then the version it was carried at.
    route_log: list[RouteChange] = Field(default_factory=list)
    route_log_floor: int | None = None
    # The ledger is split into `cells` workflows by node (workflows/ledger_cells.py); this
    # state is cell `cell`'s. Cell 0 (the `cluster` workflow) also holds the idle models and
    # the routes of replicas with no node yet and of external endpoints.
    cells: int = Field(default=1, ge=1)
    cell: int = Field(default=0, ge=0)


class LedgerCells(BaseModel):
    """How many cells the cluster's ledger has. `fixed`: it can no longer change (nodes have
    registered, or it was set above 1), so a process may remember it."""

    cells: int = Field(ge=1)
    fixed: bool = False


class PlacementOffer(BaseModel):
    """A cell's answer to "could you place this replica now?", placing nothing: whether it
    fits, with which profile, and whether the node it would choose must fetch the weights;
    else why not, summarised."""

    replica_id: str
    fits: bool
    # The cell placed this replica already (a retried placement): it goes nowhere else.
    held: bool = False
    profile_index: int = 0
    fetches: bool = False
    summary: str = ""


class ReplicaHeld(BaseModel):
    """Whether a cell holds a replica's allocation or route (so a release goes there)."""

    allocation: bool = False
    route: bool = False


class LedgerAck(BaseModel):
    version: int
