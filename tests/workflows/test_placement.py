"""Placement as pure data: random clusters and request streams, checked against the promises an
operator relies on, and the cases an operator would recognise. No Temporal here."""

from collections import Counter

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from workflows.contracts import (
    Allocation,
    EngineState,
    EngineStatus,
    GpuFabric,
    GpuInfo,
    ImexInfo,
    LedgerState,
    MigInstance,
    ModelSpec,
    NetworkPort,
    NodeInventory,
    NodeRecord,
    NodeState,
    PlacementRefused,
    PlacementRequest,
    Profile,
)
from workflows.placement import CLUSTER, NodeUsage, explain, node_usage, place, why_not

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
        **kw,  # type: ignore[arg-type]
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
        **kw,  # type: ignore[arg-type]
    )


def cpu_profile(cores: int = 1, **kw: object) -> Profile:
    return Profile(engine="llamacpp", cpu_cores=cores, memory_mb=64, **kw)  # type: ignore[arg-type]


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


# --- random clusters ---------------------------------------------------------------------


@st.composite
def clusters(draw: st.DrawFn) -> LedgerState:
    names = draw(st.lists(st.sampled_from("abcdefg"), unique=True, min_size=2, max_size=7))
    records: dict[str, NodeRecord] = {}
    for name in sorted(names):
        kind = draw(st.sampled_from(["gpu", "cpu", "gpu", "mig"]))
        gpus: list[GpuInfo] = []
        if kind == "gpu":
            # Mostly one class, so multi-node replicas find enough nodes of it.
            cls = draw(st.sampled_from(["h100-80g", "h100-80g", "a100-80g", "l40s-48g"]))
            gpus = [gpu(i, cls) for i in range(draw(st.sampled_from([8, 4, 8, 2, 0])))]
        elif kind == "mig":
            gpus = mig_instances(draw(st.integers(1, 2)), draw(st.integers(1, 3)))
        # Now and then a GPU is broken; placement must never hand it out.
        gpus = [
            g.model_copy(update={"unusable": "3 uncorrected ECC errors"})
            if draw(st.integers(0, 9)) == 9
            else g
            for g in gpus
        ]
        domain = draw(st.sampled_from(["dom-1", None, "dom-1", "dom-2"])) if gpus else None
        imex = draw(st.sampled_from([IMEX_UP, ImexInfo(installed=True), IMEX_UP]))
        ports = draw(st.sampled_from([[IB], [], [ROCE], [IB, ROCE]]))
        healthy = draw(st.integers(0, 3)) < 3
        port_min = draw(st.integers(18000, 18010))
        record = node(
            name,
            cores=draw(st.sampled_from([64, 32, 8, 2, 0])),
            gpus=gpus,
            domain=domain,
            imex=imex,
            ports=ports,
            port_min=port_min,
            # Some nodes have only a few engine ports, so ports run out before cores do.
            port_max=port_min + draw(st.integers(0, 6)),
        )
        record.inventory.memory_mb = draw(st.sampled_from([262144, 65536, 4096, 0]))
        if not healthy:
            record.state = draw(st.sampled_from(NodeState))
            record.cordoned = draw(st.booleans())
            record.engines["vllm"].state = draw(st.sampled_from(EngineState))
        if draw(st.booleans()):
            record.engines["llamacpp"].version = "2"
        records[name] = record
    state = LedgerState(nodes=records)
    # An allocation from before shards existed: its leader must still count.
    for name, record in records.items():
        inv = record.inventory
        if inv.cpu_cores >= 1 and inv.memory_mb >= 64 and draw(st.integers(0, 4)) == 4:
            state.allocations[f"old-{name}"] = Allocation(
                replica_id=f"old-{name}",
                node=name,
                address=inv.address,
                port=record.port_min,
                cpu_cores=1,
                memory_mb=64,
            )
    return state


@st.composite
def profiles(draw: st.DrawFn) -> Profile:
    cls = draw(st.sampled_from(["h100-80g", None, "h100-80g", "a100-80g", "l40s-48g", MIG]))
    if cls is None:
        return Profile(
            engine="llamacpp",
            engine_version=draw(st.sampled_from(["", "1", "2"])),
            cpu_cores=draw(st.integers(1, 4)),
            memory_mb=draw(st.integers(64, 8192)),
            nodes=draw(st.sampled_from([1, 1, 1, 2])),
        )
    per_node = draw(st.sampled_from([1, 1, 2, 3, 4, 8]))
    nodes = draw(st.sampled_from([1, 2, 1, 3]))
    if cls == MIG and draw(st.integers(0, 3)) > 0:
        per_node, nodes = 1, 1  # mostly valid MIG profiles, sometimes not
    return Profile(
        engine="vllm",
        gpu_class=cls,
        gpus_per_node=per_node,
        tensor_parallel=per_node,
        nodes=nodes,
        cpu_cores=draw(st.integers(1, 4)),
        memory_mb=draw(st.integers(64, 8192)),
        quantization=draw(st.sampled_from(["", "", "fp8"])),
    )


@st.composite
def requests(draw: st.DrawFn) -> PlacementRequest:
    return PlacementRequest(
        replica_id="",  # numbered by the test
        model="m",
        profiles=draw(st.lists(profiles(), min_size=1, max_size=3)),
        exclude_nodes=draw(st.lists(st.sampled_from("abcdefg"), max_size=2, unique=True)),
    )


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


def eligible(state: LedgerState, profile: Profile, exclude: list[str]) -> list[str]:
    return [
        n
        for n, rec in sorted(state.nodes.items())
        if why_not(rec, profile, node_usage(state, n), exclude) is None
    ]


def check_allocation(state: LedgerState, request: PlacementRequest, alloc: Allocation) -> None:
    """Every constraint of the chosen profile holds on every shard. `state` is before."""
    profile = request.profiles[alloc.profile_index]
    fits = eligible(state, profile, request.exclude_nodes)
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
        assert record.state == NodeState.READY and not record.cordoned
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
            assert len(shards) == len(chosen) == 1 and chosen[0].mig is not None
    if profile.nodes == 1:
        assert alloc.fabric == "" and alloc.nvlink_domain == ""
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
            assert inv.gpus and all(
                g.fabric is not None and g.fabric.joined and g.fabric.domain == alloc.nvlink_domain
                for g in inv.gpus
            )
            assert inv.imex is not None and inv.imex.running and inv.imex.channels
    else:
        assert alloc.fabric in ("infiniband", "roce") and alloc.nvlink_domain == ""
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
        fits = eligible(state, profile, request.exclude_nodes)
        # Refused means no profile fits: a single-node one has no node at all.
        assert profile.nodes > 1 or not fits
    for name, reason in reasons.items():
        if several:
            assert reason.startswith("profile ")
        elif name != CLUSTER:
            rec = state.nodes[name]
            profile = request.profiles[0]
            expected = why_not(rec, profile, node_usage(state, name), request.exclude_nodes)
            assert reason == expected or (expected is None and reason.startswith("fits, but"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), st.lists(requests(), min_size=5, max_size=25), st.randoms(use_true_random=False))
def test_placement_keeps_its_promises(state, reqs, rnd):
    check_cluster(state)
    for i, request in enumerate(reqs):
        request = request.model_copy(update={"replica_id": f"m-{i}"})
        decision = place(state, request)
        if isinstance(decision, PlacementRefused):
            event("refused")
            check_refusal(state, request, decision.reasons)
            continue
        # So `--hypothesis-show-statistics` shows every kind of placement is exercised.
        profile = request.profiles[decision.profile_index]
        event(f"placed {profile.gpu_class or 'cpu'} {decision.fabric or 'one node'}")
        check_allocation(state, request, decision)
        # The profiles before the one chosen fit nowhere on their own.
        for earlier in request.profiles[: decision.profile_index]:
            alone = request.model_copy(update={"profiles": [earlier]})
            assert isinstance(place(state, alone), PlacementRefused)
        state.allocations[request.replica_id] = decision
        check_cluster(state)
        # Placement is idempotent per replica.
        assert place(state, request) == decision
        # Now and then a replica goes away and gives back what it held.
        if state.allocations and rnd.random() < 0.3:
            del state.allocations[rnd.choice(sorted(state.allocations))]


@st.composite
def gpu_racks(draw: st.DrawFn) -> LedgerState:
    """Only 8 x h100 nodes, in up to two NVLink domains, with IMEX and ports up or down: the
    clusters multi-node replicas are for."""
    names = draw(st.lists(st.sampled_from("abcdefgh"), unique=True, min_size=2, max_size=8))
    records = {}
    for name in sorted(names):
        records[name] = node(
            name,
            64,
            h100s(8),
            domain=draw(st.sampled_from(["rack-1", "rack-2", None])),
            imex=draw(st.sampled_from([IMEX_UP, ImexInfo(installed=True)])),
            ports=draw(st.sampled_from([[IB], [ROCE], [], [IB, ROCE]])),
        )
    return LedgerState(nodes=records)


@settings(max_examples=100, deadline=None)
@given(
    gpu_racks(),
    st.lists(
        st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from([2, 1, 3, 4])),
        min_size=3,
        max_size=20,
    ),
)
def test_multi_node_replicas_keep_to_one_fabric(state, shapes):
    for i, (per_node, count) in enumerate(shapes):
        request = req(f"m-{i}", gpu_profile(per_node=per_node, nodes=count))
        decision = place(state, request)
        if isinstance(decision, PlacementRefused):
            event("refused")
            check_refusal(state, request, decision.reasons)
            continue
        event(f"placed {decision.fabric or 'one node'}")
        check_allocation(state, request, decision)
        state.allocations[request.replica_id] = decision
        check_cluster(state)


@given(st.lists(st.integers(4, 32), min_size=1, max_size=5), st.integers(1, 20))
def test_identical_cpu_requests_spread_evenly_over_nodes(cores, count):
    state = LedgerState(nodes={f"n{i}": node(f"n{i}", c) for i, c in enumerate(cores)})
    for i in range(count):
        decision = place(state, req(f"m-{i}", cpu_profile()))
        if isinstance(decision, PlacementRefused):
            # Only once every node is full.
            assert all(
                node_usage(state, n).shards == rec.inventory.cpu_cores
                for n, rec in state.nodes.items()
            )
            continue
        state.allocations[decision.replica_id] = decision
    per_node = Counter(a.node for a in state.allocations.values())
    open_nodes = [n for n, rec in state.nodes.items() if per_node[n] < rec.inventory.cpu_cores]
    if open_nodes:
        counts = [per_node[n] for n in open_nodes]
        assert max(counts) - min(counts) <= 1
        assert all(per_node[n] <= max(counts) + 1 for n in state.nodes)


# --- what an operator would recognise ----------------------------------------------------


def test_an_empty_cluster_says_no_node_has_registered():
    assert refused(LedgerState(), req("m-0", cpu_profile())) == {
        CLUSTER: "no nodes have registered"
    }


def test_refusal_reasons_name_what_is_missing():
    installing = node("b", 8)
    installing.engines["llamacpp"] = EngineStatus(
        engine="llamacpp", version="1", state=EngineState.INSTALLING, detail="building 45%"
    )
    no_vllm = node("f", 8)
    no_vllm.engines["vllm"] = EngineStatus(
        engine="vllm", version="0.32.0", state=EngineState.UNAVAILABLE, detail="needs an NVIDIA GPU"
    )
    state = LedgerState(
        nodes={
            "a": node("a", 1),
            "b": installing,
            "c": node("c", 8, cordoned=True, note="disk swap"),
            "d": node("d", 8, state=NodeState.LOST),
            "e": node("e", 8),
        }
    )
    request = req("m-0", cpu_profile(2, engine_version="1"), exclude=["e"])
    assert refused(state, request) == {
        "a": "1 of 1 CPU cores free, 2 wanted",
        "b": "llamacpp installing: building 45%",
        "c": "node is cordoned (disk swap)",
        "d": "node is lost",
        "e": "excluded: moving away from this node",
    }
    gpus = LedgerState(
        nodes={
            "f": no_vllm,
            "g": node("g", 8, h100s(8)).model_copy(
                update={"engines": installed("vllm", version="0.31.0")}
            ),
            "h": node("h", 8, [gpu(i, "a100-80g") for i in range(8)]),
        }
    )
    assert refused(gpus, req("m-1", gpu_profile(per_node=4, engine_version="0.32.0"))) == {
        "f": "vllm unavailable: needs an NVIDIA GPU",
        "g": "vllm 0.31.0 installed, 0.32.0 wanted",
        "h": "vllm 1 installed, 0.32.0 wanted",
    }
    h = gpus.nodes["h"]
    assert why_not(h, gpu_profile(per_node=4), NodeUsage()) == "no h100-80g GPUs"


def test_bin_packing_leaves_a_whole_node_free_for_an_eight_gpu_replica():
    state = LedgerState(nodes={"a": node("a", 64, h100s(8)), "b": node("b", 64, h100s(8))})
    small = [placed(state, req(f"small-{i}", gpu_profile(per_node=2))) for i in range(4)]
    assert {a.node for a in small} == {"a"}  # all four on one node, not two on each
    assert sorted(i for a in small for i in a.shards[0].gpus) == list(range(8))
    big = placed(state, req("big", gpu_profile(per_node=8)))
    assert big.node == "b" and big.shards[0].gpus == list(range(8))
    assert refused(state, req("more", gpu_profile(per_node=1))) == {
        "a": "0 of 8 h100-80g free, 1 wanted",
        "b": "0 of 8 h100-80g free, 1 wanted",
    }


def test_the_tightest_node_wins_even_when_it_is_not_first_by_name():
    state = LedgerState(nodes={"a": node("a", 64, h100s(8)), "b": node("b", 64, h100s(2))})
    assert placed(state, req("m-0", gpu_profile(per_node=2))).node == "b"


def test_gpus_on_one_node_are_nvlink_connected_where_the_matrix_says_so():
    # 0-2 and 1-3 are NVLink pairs; 0-1 only meet over the CPU interconnect.
    matrix = [
        ["X", "SYS", "NV12", "SYS"],
        ["SYS", "X", "SYS", "NV12"],
        ["NV12", "SYS", "X", "SYS"],
        ["SYS", "NV12", "SYS", "X"],
    ]
    record = node("a", 64, h100s(4))
    record.inventory.nvlink_matrix = matrix
    state = LedgerState(nodes={"a": record})
    assert placed(state, req("m-0", gpu_profile(per_node=2))).shards[0].gpus == [0, 2]
    assert placed(state, req("m-1", gpu_profile(per_node=2))).shards[0].gpus == [1, 3]


def two_by_four() -> Profile:
    return gpu_profile(per_node=4, nodes=2)


def test_a_two_node_replica_lands_in_the_nvlink_domain_before_infiniband():
    state = LedgerState(
        nodes={
            "a": node("a", 64, h100s(4), ports=[IB]),
            "b": node("b", 64, h100s(4), ports=[IB]),
            "c": node("c", 64, h100s(4), domain="rack-1", ports=[IB]),
            "d": node("d", 64, h100s(4), domain="rack-1", ports=[IB]),
        }
    )
    alloc = placed(state, req("m-0", two_by_four()))
    assert alloc.fabric == "nvlink" and alloc.nvlink_domain == "rack-1/1"
    assert [(s.node, s.rank, s.gpus) for s in alloc.shards] == [
        ("c", 0, [0, 1, 2, 3]),
        ("d", 1, [0, 1, 2, 3]),
    ]
    assert alloc.node == "c"  # the leader is rank 0
    second = placed(state, req("m-1", two_by_four()))
    assert (second.fabric, [s.node for s in second.shards]) == ("infiniband", ["a", "b"])


def test_a_domain_with_imex_down_is_skipped_with_the_reason():
    down = ImexInfo(installed=True, running=False, detail="nvidia-imex.service: failed")
    nodes = {
        n: node(n, 64, h100s(4), domain="rack-1", imex=down, ports=[ROCE] if n in "cd" else [])
        for n in "abcd"
    }
    state = LedgerState(nodes=nodes)
    # c and d also have RoCE: the replica goes there, never half over NVLink.
    alloc = placed(state, req("m-0", two_by_four()))
    assert (alloc.fabric, [s.node for s in alloc.shards]) == ("roce", ["c", "d"])
    reasons = refused(state, req("m-1", two_by_four()))
    assert reasons["a"] == (
        "fits, but shares no fabric with enough others (NVLink domain rack-1/1: IMEX not "
        "running (nvidia-imex.service: failed))"
    )
    assert reasons["c"] == "0 of 4 h100-80g free, 4 wanted"
    assert reasons[CLUSTER] == (
        "no NVLink domain or fabric has 2 nodes with 4 free h100-80g each (2 of 4 nodes fit alone)"
    )


def test_fabrics_and_domains_are_never_mixed():
    state = LedgerState(
        nodes={
            "a": node("a", 64, h100s(4), domain="rack-1", ports=[IB]),
            "b": node("b", 64, h100s(4), domain="rack-2", ports=[ROCE]),
        }
    )
    reasons = refused(state, req("m-0", two_by_four()))
    assert reasons["a"].startswith("fits, but") and CLUSTER in reasons


def test_mig_instances_are_handed_out_one_at_a_time():
    state = LedgerState(nodes={"a": node("a", 64, mig_instances(2, 2))})
    got = [placed(state, req(f"m-{i}", gpu_profile(MIG))).shards[0] for i in range(4)]
    assert [s.gpus for s in got] == [[1000], [1001], [1100], [1101]]
    assert [s.gpu_uuids for s in got] == [[f"GPU-{MIG}-{s.gpus[0]}"] for s in got]
    assert refused(state, req("m-4", gpu_profile(MIG))) == {"a": f"0 of 4 {MIG} free, 1 wanted"}


def test_a_mig_profile_wanting_more_than_one_instance_is_refused_here_too():
    state = LedgerState(nodes={"a": node("a", 64, mig_instances(2, 2))})
    reasons = refused(state, req("m-0", gpu_profile(MIG, per_node=2)))
    assert reasons["a"].startswith(f"{MIG} is a MIG instance: a replica runs on exactly one")


def test_a_gpu_with_ecc_errors_is_never_handed_out():
    bad = gpu(0, unusable="3 uncorrected ECC errors")
    state = LedgerState(nodes={"a": node("a", 64, [bad, gpu(1)])})
    assert placed(state, req("m-0", gpu_profile())).shards[0].gpus == [1]
    assert refused(state, req("m-1", gpu_profile())) == {
        "a": "0 of 2 h100-80g free, 1 wanted (GPU 0: 3 uncorrected ECC errors)"
    }


def test_fp8_on_an_a100_is_refused_with_the_reason():
    state = LedgerState(
        nodes={
            "a": node("a", 64, [gpu(i, "a100-80g") for i in range(8)]),
            "b": node("b", 64, [gpu(i, "l40s-48g") for i in range(8)]),
        }
    )
    reasons = refused(state, req("m-0", gpu_profile("a100-80g", 2, quantization="fp8")))
    assert reasons == {
        "a": "fp8 needs compute capability 8.9 or newer; a100-80g is 8.0",
        "b": "no a100-80g GPUs",
    }
    assert placed(state, req("m-1", gpu_profile("l40s-48g", 2, quantization="fp8"))).node == "b"


def test_reasons_say_which_profile_they_are_for():
    state = LedgerState(nodes={"a": node("a", 2, h100s(2))})
    reasons = refused(state, req("m-0", gpu_profile(per_node=4), cpu_profile(4)))
    assert reasons == {
        "a": "profile 1 (vllm h100-80g x4): 2 of 2 h100-80g free, 4 wanted; "
        "profile 2 (llamacpp cpu): 2 of 2 CPU cores free, 4 wanted"
    }


def test_the_second_profile_is_used_when_the_first_fits_nowhere():
    state = LedgerState(nodes={"a": node("a", 64, h100s(2)), "b": node("b", 64)})
    alloc = placed(state, req("m-0", gpu_profile(per_node=4), gpu_profile(per_node=2)))
    assert (alloc.profile_index, alloc.node, alloc.shards[0].gpus) == (1, "a", [0, 1])
    # The first profile still wins when it fits.
    assert placed(state, req("m-1", cpu_profile(), gpu_profile())).profile_index == 0


def test_cores_and_memory_are_reserved_for_gpu_replicas_too():
    state = LedgerState(nodes={"a": node("a", 6, h100s(8))})
    placed(state, req("m-0", gpu_profile()))  # 4 cores
    assert refused(state, req("m-1", gpu_profile())) == {"a": "2 of 6 CPU cores free, 4 wanted"}


def test_an_allocation_from_before_shards_still_counts():
    state = LedgerState(nodes={"a": node("a", 2, port_max=18000)})
    state.allocations["old"] = Allocation(
        replica_id="old", node="a", address="x", port=18000, cpu_cores=1, memory_mb=64
    )
    usage = node_usage(state, "a")
    assert (usage.cpu_cores, usage.memory_mb, usage.ports, usage.shards) == (1, 64, {18000}, 1)
    assert refused(state, req("m-0", cpu_profile())) == {"a": "no free engine port"}


def test_fifty_sequential_placements_on_a_small_cluster_never_double_book():
    state = LedgerState(
        nodes={
            "a": node("a", 32, h100s(8), domain="rack-1", ports=[IB]),
            "b": node("b", 32, h100s(8), domain="rack-1", ports=[IB]),
            "c": node("c", 32, h100s(4), ports=[IB]),
            "d": node("d", 16, mig_instances(1, 3)),
        }
    )
    shapes = [
        gpu_profile(per_node=1),
        gpu_profile(per_node=2),
        gpu_profile(per_node=4, nodes=2),
        gpu_profile(MIG),
        cpu_profile(2),
    ]
    outcomes = Counter()
    for i in range(50):
        request = req(f"m-{i}", shapes[i % len(shapes)])
        decision = place(state, request)
        if isinstance(decision, Allocation):
            check_allocation(state, request, decision)
            state.allocations[request.replica_id] = decision
            outcomes["placed"] += 1
        else:
            check_refusal(state, request, decision.reasons)
            outcomes["refused"] += 1
        check_cluster(state)
        if i % 7 == 6:  # a replica goes away now and then
            del state.allocations[sorted(state.allocations)[0]]
    assert outcomes["placed"] > 10 and outcomes["refused"] > 0


def test_explain_reserves_nothing_and_says_why_for_every_node():
    state = LedgerState(nodes={"a": node("a", 64, h100s(2)), "b": node("b", 2)})
    spec = ModelSpec(name="m", weights="w", profiles=[gpu_profile(per_node=4), cpu_profile(2)])
    assert explain(state, spec) == [
        "profile 1 (vllm h100-80g x4): fits nowhere",
        "  a: 2 of 2 h100-80g free, 4 wanted",
        "  b: no h100-80g GPUs",
        "profile 2 (llamacpp cpu): would go to a",
        "  a: fits",
        "  b: fits",
    ]
    assert not state.allocations
    assert explain(LedgerState(), spec) == ["no nodes have registered"]
