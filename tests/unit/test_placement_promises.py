"""Placement as pure data: random clusters and request streams, checked against the promises
an operator relies on (nothing handed out twice, every constraint kept, spreading and
bin-packing). No Temporal here."""

import random
from collections import Counter

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.unit.placement_kit import (
    IB,
    IMEX_UP,
    MIG,
    ROCE,
    check_allocation,
    check_cluster,
    check_refusal,
    cpu_profile,
    gpu,
    gpu_profile,
    h100s,
    mig_instances,
    node,
    req,
)
from workflows.artifact_names import artifact_hint
from workflows.contracts import (
    Allocation,
    EngineState,
    GpuInfo,
    ImexInfo,
    LedgerState,
    NodeRecord,
    NodeState,
    PlacementRefused,
    PlacementRequest,
    Profile,
)
from workflows.placement import node_usage, place

# --- random clusters ---------------------------------------------------------------------

WEIGHTS = "sha256:" + "3c" * 32


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
        # Some hold the weights some requests name; the free disk for fetching is now and then
        # unknown (an older agent) or short.
        record.inventory.artifacts = draw(st.sampled_from([[], [], [artifact_hint(WEIGHTS)]]))
        record.inventory.artifact_disk_free_mb = draw(
            st.sampled_from([None, 0, 400, 2000, 50_000, 50_000])
        )
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
        artifact=draw(st.sampled_from(["", WEIGHTS])),
        artifact_size=draw(st.sampled_from([0, 10**9, 30 * 10**9])),
    )


# --- promises ----------------------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), st.lists(requests(), min_size=5, max_size=25), st.randoms(use_true_random=False))
def test_placement_keeps_its_promises(
    state: LedgerState, reqs: list[PlacementRequest], rnd: random.Random
) -> None:
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
        if request.artifact:
            holder = (
                artifact_hint(request.artifact) in state.nodes[decision.node].inventory.artifacts
            )
            event("placed where the weights are" if holder else "placed where they must be fetched")
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
def test_multi_node_replicas_keep_to_one_fabric(
    state: LedgerState, shapes: list[tuple[int, int]]
) -> None:
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
def test_identical_cpu_requests_spread_evenly_over_nodes(cores: list[int], count: int) -> None:
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


def test_fifty_sequential_placements_on_a_small_cluster_never_double_book() -> None:
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
    outcomes: Counter[str] = Counter()
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
    assert outcomes["placed"] > 10
    assert outcomes["refused"] > 0
