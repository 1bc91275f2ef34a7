"""Placement as pure data, shared by the tests/unit/test_placement_*.py files: the building
blocks of clusters and requests, and the invariants every placement decision must keep.
No Temporal here."""

from collections import Counter

from workflows.contracts import (
    Allocation,
    EngineState,
    EngineStatus,
    GpuFabric,
    GpuInfo,
    ImexInfo,
    LedgerState,
    MigInstance,
    NetworkPort,
    NodeInventory,
    NodeRecord,
    NodeState,
    PlacementRefused,
    PlacementRequest,
    Profile,
)
from workflows.placement import CLUSTER, node_usage, place, why_not
from workflows.placement.disk import holds

CLASSES = {"h100-80g": "9.0", "a100-80g": "8.0", "l40s-48g": "8.9"}
MIG = "a100-80g-mig-3g.40gb"

# --- building blocks ---------------------------------------------------------------------


def gpu(index: int, cls: str = "h100-80g", **kw: object) -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=f"GPU-{cls}-{index}",
        name=cls,
        gpu_class=cls,
        memory_mb=81920,
        compute_capability=CLASSES.get(cls.split("-mig-")[0], "9.0"),
        **kw,
    )


def mig_instances(cards: int, per_card: int) -> list[GpuInfo]:
    return [
        gpu(
            1000 + 100 * card + inst,
            MIG,
            mig=MigInstance(
                parent_index=card,
                parent_uuid=f"GPU-{card}",
                profile="3g.40gb",
                gpu_instance_id=inst,
            ),
        )
        for card in range(cards)
        for inst in range(per_card)
    ]


def joined(domain: str) -> GpuFabric:
    return GpuFabric(state="Completed", status="Success", cluster_uuid=domain, clique_id=1)


IB = NetworkPort(device="mlx5_0", link_layer="InfiniBand", state="4: ACTIVE")
ROCE = NetworkPort(device="mlx5_1", link_layer="Ethernet", state="4: ACTIVE", roce_v2_gid_index=3)
IMEX_UP = ImexInfo(installed=True, running=True, channels=[0])


def installed(*engines: str, version: str = "1") -> dict[str, EngineStatus]:
    return {
        e: EngineStatus(engine=e, version=version, state=EngineState.INSTALLED) for e in engines
    }


def node(
    name: str,
    cores: int = 64,
    gpus: list[GpuInfo] | None = None,
    *,
    domain: str | None = None,
    imex: ImexInfo | None = IMEX_UP,
    ports: list[NetworkPort] | None = None,
    **kw: object,
) -> NodeRecord:
    gpus = gpus or []
    if domain is not None:
        gpus = [g.model_copy(update={"fabric": joined(domain)}) for g in gpus]
    record = NodeRecord(
        inventory=NodeInventory(
            name=name,
            address=f"10.0.0.{ord(name[-1]) % 250}",
            cpu_cores=cores,
            memory_mb=262144,
            gpus=gpus,
            imex=imex if domain is not None else None,
            network_ports=ports or [],
        ),
        state=NodeState.READY,
        engines=installed("llamacpp", "vllm"),
    )
    return record.model_copy(update=kw)


def h100s(n: int) -> list[GpuInfo]:
    return [gpu(i) for i in range(n)]


def gpu_profile(cls: str = "h100-80g", per_node: int = 1, nodes: int = 1, **kw: object) -> Profile:
    return Profile(
        engine="vllm",
        gpu_class=cls,
        gpus_per_node=per_node,
        tensor_parallel=per_node if "-mig-" not in cls else 1,
        nodes=nodes,
        cpu_cores=4,
        memory_mb=8192,
        **kw,
    )


def cpu_profile(cores: int = 1, **kw: object) -> Profile:
    return Profile(engine="llamacpp", cpu_cores=cores, memory_mb=64, **kw)


def req(replica_id: str, *profiles: Profile, exclude: list[str] | None = None) -> PlacementRequest:
    return PlacementRequest(
        replica_id=replica_id, model="m", profiles=list(profiles), exclude_nodes=exclude or []
    )


def placed(state: LedgerState, request: PlacementRequest) -> Allocation:
    decision = place(state, request)
    assert isinstance(decision, Allocation), decision
    state.allocations[request.replica_id] = decision
    return decision


def refused(state: LedgerState, request: PlacementRequest) -> dict[str, str]:
    decision = place(state, request)
    assert isinstance(decision, PlacementRefused), decision
    return decision.reasons


# --- invariants --------------------------------------------------------------------------


def check_cluster(state: LedgerState) -> None:
    """Nothing is handed out twice, and no node gives more than it has."""
    gpus: Counter[tuple[str, int]] = Counter()
    ports: Counter[tuple[str, int]] = Counter()
    for alloc in state.allocations.values():
        shards = alloc.shards_or_leader()
        assert len({s.node for s in shards}) == len(shards), "two shards on one node"
        for shard in shards:
            gpus.update((shard.node, i) for i in shard.gpus)
            ports[(shard.node, shard.port)] += 1
    assert max(gpus.values(), default=1) == 1, f"a GPU handed out twice: {gpus.most_common(1)}"
    assert max(ports.values(), default=1) == 1, f"a port handed out twice: {ports.most_common(1)}"
    for name, record in state.nodes.items():
        usage = node_usage(state, name)
        assert usage.cpu_cores <= record.inventory.cpu_cores
        assert usage.memory_mb <= record.inventory.memory_mb
        assert all(record.port_min <= p <= record.port_max for p in usage.ports)
        known = {g.index: g for g in record.inventory.gpus}
        assert usage.gpus <= set(known)


def free_of_class(state: LedgerState, name: str, cls: str) -> int:
    used = node_usage(state, name).gpus
    return sum(
        1
        for g in state.nodes[name].inventory.gpus
        if g.gpu_class == cls and g.index not in used and not g.unusable
    )


def eligible(state: LedgerState, profile: Profile, request: PlacementRequest) -> list[str]:
    return [
        n for n, rec in sorted(state.nodes.items()) if node_says(state, n, request, profile) is None
    ]


def node_says(
    state: LedgerState, name: str, request: PlacementRequest, profile: Profile
) -> str | None:
    """why_not for one node, as the request asks it."""
    return why_not(
        state.nodes[name],
        profile,
        node_usage(state, name),
        request.exclude_nodes,
        artifact=request.artifact,
        artifact_size=request.artifact_size,
    )


def check_allocation(state: LedgerState, request: PlacementRequest, alloc: Allocation) -> None:
    """Every constraint of the chosen profile holds on every shard. `state` is before."""
    profile = request.profiles[alloc.profile_index]
    fits = eligible(state, profile, request)
    shards = alloc.shards
    assert [s.rank for s in shards] == list(range(profile.nodes))
    assert (alloc.node, alloc.address, alloc.port) == (
        shards[0].node,
        shards[0].address,
        shards[0].port,
    )
    for shard in shards:
        record = state.nodes[shard.node]
        assert shard.node in fits
        free_disk = record.inventory.artifact_disk_free_mb
        fetches = bool(request.artifact) and not holds(record, request.artifact)
        if fetches and request.artifact_size and free_disk is not None:
            # Room for the weights and the margin (at least 500 MB) on a node that fetches.
            assert free_disk * 10**6 >= request.artifact_size + 500 * 10**6
        assert record.state == NodeState.READY
        assert not record.cordoned
        assert shard.node not in request.exclude_nodes
        engine = record.engines[profile.engine]
        assert engine.state == EngineState.INSTALLED
        assert not profile.engine_version or engine.version == profile.engine_version
        assert (shard.cpu_cores, shard.memory_mb) == (profile.cpu_cores, profile.memory_mb)
        assert shard.address == record.inventory.address
        by_index = {g.index: g for g in record.inventory.gpus}
        chosen = [by_index[i] for i in shard.gpus]
        assert len(chosen) == profile.gpus_per_node == len(set(shard.gpus))
        assert shard.gpu_uuids == [g.uuid for g in chosen]
        for g in chosen:
            assert g.gpu_class == profile.gpu_class
            assert not g.unusable
            if profile.quantization == "fp8":
                assert g.compute_capability >= "8.9"
        if profile.gpu_class is not None and "-mig-" in profile.gpu_class:
            assert len(shards) == len(chosen) == 1
            assert chosen[0].mig is not None
    if profile.nodes == 1:
        assert alloc.fabric == ""
        assert alloc.nvlink_domain == ""
        holders = [n for n in fits if holds(state.nodes[n], request.artifact)]
        if holders:
            # A node holding the weights wins over one that would fetch them; the rules below
            # decide among the holders.
            assert alloc.node in holders
            fits = holders
        if profile.gpu_class is not None:
            # Bin-packing: no node that could take it had fewer free GPUs of the class.
            cls = profile.gpu_class
            assert free_of_class(state, alloc.node, cls) == min(
                free_of_class(state, n, cls) for n in fits
            )
        else:
            # Spreading: no node that could take it had fewer engine processes.
            shards_on = {n: node_usage(state, n).shards for n in fits}
            assert shards_on[alloc.node] == min(shards_on.values())
        return
    inventories = [state.nodes[s.node].inventory for s in shards]
    if alloc.fabric == "nvlink":
        for inv in inventories:
            assert inv.gpus
            assert all(
                g.fabric is not None and g.fabric.joined and g.fabric.domain == alloc.nvlink_domain
                for g in inv.gpus
            )
            assert inv.imex is not None
            assert inv.imex.running
            assert inv.imex.channels
    else:
        assert alloc.fabric in ("infiniband", "roce")
        assert alloc.nvlink_domain == ""
        for inv in inventories:
            assert any(
                p.kind == alloc.fabric
                and p.active
                and (alloc.fabric == "infiniband" or p.roce_v2_gid_index is not None)
                for p in inv.network_ports
            )


def check_refusal(state: LedgerState, request: PlacementRequest, reasons: dict[str, str]) -> None:
    assert set(state.nodes) <= set(reasons) <= set(state.nodes) | {CLUSTER}
    assert all(reasons.values())
    several = len(request.profiles) > 1
    for profile in request.profiles:
        fits = eligible(state, profile, request)
        # Refused means no profile fits: a single-node one has no node at all.
        assert profile.nodes > 1 or not fits
    for name, reason in reasons.items():
        if several:
            assert reason.startswith("profile ")
        elif name != CLUSTER:
            expected = node_says(state, name, request, request.profiles[0])
            assert reason == expected or (expected is None and reason.startswith("fits, but"))
