"""The ledger: placement, allocations, routes and the cluster ledger's state."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    Discriminator,
    Field,
    SerializerFunctionWrapHandler,
    Tag,
    model_serializer,
)

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
    # PlacementAnswer's tag (below). Absent from payloads of before it; a default, not a
    # required field, so those still decode.
    kind: Literal["allocation"] = "allocation"

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
    kind: Literal["refusal"] = "refusal"  # PlacementAnswer's tag, as Allocation.kind


def placement_kind(value: object) -> str:
    """Which of PlacementAnswer's members `value` is: its `kind`, or for a payload from before
    the tag its shape (only a refusal has a summary). Chosen here rather than by pydantic's
    union heuristics, which have changed between the versions the project allows."""
    if isinstance(value, dict):
        kind = value.get("kind")
        if isinstance(kind, str):
            return kind
        return "refusal" if "summary" in value else "allocation"
    return str(getattr(value, "kind", "allocation"))


# What placement answers: where the replica runs, or why nowhere.
PlacementAnswer = Annotated[
    Annotated[Allocation, Tag("allocation")] | Annotated[PlacementRefusal, Tag("refusal")],
    Discriminator(placement_kind),
]


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
    # How each closed one ended: "completed" (it returned: a replica only does once it has
    # stopped its engine and released), "terminated", "canceled", "failed", "timed_out", or
    # "not_found". Empty in answers from before it existed.
    closed: dict[str, str] = Field(default_factory=dict)

    def ended_unbidden(self, workflow_id: str) -> bool:
        """Closed without returning: an operator terminated or cancelled it, or it failed.
        What it held (an engine, an allocation) was left as it was."""
        return self.closed.get(workflow_id, COMPLETED) not in (COMPLETED, NOT_FOUND)


# WorkflowStatuses.closed's words for a run that returned, and for no run at all.
COMPLETED = "completed"
NOT_FOUND = "not_found"


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
    request's tokens the way its engine does (kv/hashes.py)."""

    # The node agent's KV feed (kv/feed.py), "http://address:port"; "" for an
    # external engine, whose own publisher the gateway subscribes to (`publisher`).
    feed: str = ""
    block_size: int
    # The engine's PYTHONHASHSEED (its hashes' seed); None when it has none.
    hash_seed: str | None = None
    # The engine's LoRA adapters, name to path as its command line gave them: vLLM keys every
    # block of an adapter's request by ("lora", name, path) (gateway/routing/kv_blocks.py).
    adapters: dict[str, str] = Field(default_factory=dict)
    # External engines only (Profile.external_kv): the engine's ZMQ publisher, its replay
    # socket ("" = none) and topic, which each gateway connects to (gateway/kv/publishers.py).
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
    # vLLM started with `--scheduling-policy priority`: the gateway sends each request's class
    # as its `priority` field (gateway/admission/priority.py). False on routes from before.
    takes_priority: bool = False
    # llama.cpp: the requests it runs at once (its -np); the gateway sends it no more than that
    # (gateway/admission/). None: any other engine, or a route from before this field.
    slots: int | None = None

    @model_serializer(mode="wrap")
    def _without_unset_admission_fields(self, handler: SerializerFunctionWrapHandler) -> object:
        """takes_priority and slots only where they say something: a model's routes reach its
        workflow's history (adoption), 5,000 of them under Temporal's 2 MB payload limit, and
        the two at their defaults were 30 bytes a route."""
        data = handler(self)
        if isinstance(data, dict):
            if data.get("takes_priority") is False:
                del data["takes_priority"]
            if data.get("slots") is None:
                data.pop("slots", None)
        return data


class RoutingTable(BaseModel):
    """The fleet tables' answer to a gateway (store/fleet/tables.py routing_table): the whole
    table, the routes that changed since the asker's version (a delta), or that nothing did."""

    # Bumped on every change to what gateways read (a route, a node's state, the idle models).
    version: int = 0
    routes: list[Route] = Field(default_factory=list)
    # Models scaled to zero that a request wakes: the gateway holds the request meanwhile.
    idle_models: list[str] = Field(default_factory=list)
    # Made once with the tables: versions count within one store, and another store (a new
    # one, or a restore) begins again, so a version alone could match a table it never had.
    epoch: str = ""
    # No route changed since the asker's version: no routes are sent.
    unchanged: bool = False
    # The routes that changed since `since` (the asker's version): `routes` replace the
    # asker's by replica id, `removed` are gone. False: `routes` are the whole table.
    delta: bool = False
    since: int = -1
    removed: list[str] = Field(default_factory=list)


class RoutingTableRequest(BaseModel):
    """What the asking gateway already holds; the defaults hold nothing."""

    epoch: str = ""
    version: int = -1
    # The asker applies deltas (gateway/route_book.py).
    deltas: bool = False


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


class LoadTotals(BaseModel):
    """A model's engines' load summed over those read (`seen`), with the count of those that
    could not be read (`unseen`): what the autoscaler decides from (workflows/autoscale.py).
    Its size does not grow with the fleet."""

    seen: int = 0
    unseen: int = 0
    running: int = 0
    waiting: int = 0
    # The engines' token counters summed (EngineLoad.work).
    work: float = 0.0

    @classmethod
    def of(cls, engines: list[EngineLoad]) -> LoadTotals:
        seen = [e for e in engines if e.seen]
        return cls(
            seen=len(seen),
            unseen=len(engines) - len(seen),
            running=sum(e.running for e in seen),
            waiting=sum(e.waiting for e in seen),
            work=sum(e.work for e in seen),
        )

    def plus(self, other: LoadTotals) -> LoadTotals:
        return LoadTotals(
            seen=self.seen + other.seen,
            unseen=self.unseen + other.unseen,
            running=self.running + other.running,
            waiting=self.waiting + other.waiting,
            work=self.work + other.work,
        )


class NodeReplicas(BaseModel):
    node: str
    replica_ids: list[str] = Field(default_factory=list)


class ModelLoadRequest(BaseModel):
    """One look at a model's load (activities/control/model_load.py)."""

    model: str
    # Of the nodes whose metrics could not be read, hand back at most this many (chosen at
    # random) for the workflow to ask their agents; the rest count as unseen.
    agents_to_ask: int = Field(default=0, ge=0)


class ModelLoadReport(BaseModel):
    """The load of a model's routable replicas, summed: bounded whatever the replica count."""

    totals: LoadTotals = Field(default_factory=LoadTotals)
    nodes: int = 0  # nodes hosting a routable replica of the model
    nodes_read: int = 0  # of those, whose metrics endpoint answered with a fresh reading
    # Nodes not read whose agents the workflow asks itself (node_engine_load); their replicas
    # are in neither count of `totals`. At most ModelLoadRequest.agents_to_ask.
    ask_agents: list[NodeReplicas] = Field(default_factory=list)


class LedgerState(BaseModel):
    """What the fleet tables hold, read in one snapshot (store/fleet/tables.py snapshot): what
    placement decides on and `llmgw nodes`, `status`, the console and `top` show."""

    nodes: dict[str, NodeRecord] = Field(default_factory=dict)
    allocations: dict[str, Allocation] = Field(default_factory=dict)
    routes: dict[str, Route] = Field(default_factory=dict)
    idle_models: list[str] = Field(default_factory=list)
    version: int = 0


class LedgerAck(BaseModel):
    version: int
