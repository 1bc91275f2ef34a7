"""Placement as pure data: random clusters and request streams, checked against the promises an
operator relies on."""

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from workflows.contracts import (
    Allocation,
    EngineState,
    EngineStatus,
    LedgerState,
    NodeInventory,
    NodeRecord,
    NodeState,
    PlacementRefused,
    PlacementRequest,
)
from workflows.placement import node_usage, place, why_not


@st.composite
def nodes(draw: st.DrawFn) -> dict[str, NodeRecord]:
    names = draw(st.lists(st.sampled_from("abcdef"), unique=True, min_size=1, max_size=6))
    records = {}
    for name in names:
        # Healthy nodes are the simplest draw, so enough requests are placed to exercise scoring
        # and bookkeeping; the others are anything at all, to exercise the refusals.
        healthy = not draw(st.booleans())
        engines = {}
        if healthy or draw(st.booleans()):
            engines["llamacpp"] = EngineStatus(
                engine="llamacpp",
                version="1" if healthy else draw(st.sampled_from(["1", "2"])),
                state=EngineState.INSTALLED if healthy else draw(st.sampled_from(EngineState)),
                detail=draw(st.sampled_from(["", "building 45%"])),
            )
        port_min = draw(st.integers(18000, 18010))
        records[name] = NodeRecord(
            inventory=NodeInventory(
                name=name,
                address=f"10.0.0.{len(records) + 1}",
                cpu_cores=draw(st.integers(0, 24)),
                memory_mb=draw(st.integers(0, 32768)),
            ),
            state=NodeState.READY if healthy else draw(st.sampled_from(NodeState)),
            engines=engines,
            cordoned=False if healthy else draw(st.booleans()),
            port_min=port_min,
            # Some nodes have only a few engine ports, so ports run out before cores do.
            port_max=port_min + draw(st.integers(0, 6)),
        )
    return records


def requests() -> st.SearchStrategy[PlacementRequest]:
    return st.builds(
        PlacementRequest,
        replica_id=st.just(""),  # numbered below
        model=st.sampled_from(["m", "n"]),
        engine=st.sampled_from(["llamacpp", "llamacpp", "vllm"]),
        engine_version=st.sampled_from(["", "1", "2"]),
        cpu_cores=st.integers(1, 4),
        memory_mb=st.integers(64, 8192),
    )


def eligible(state: LedgerState, req: PlacementRequest) -> list[str]:
    return [name for name, node in state.nodes.items() if why_not(state, node, req) is None]


def replicas_on(state: LedgerState, node: str) -> int:
    return sum(1 for a in state.allocations.values() if a.node == node)


def check_invariants(state: LedgerState) -> None:
    for name, node in state.nodes.items():
        cores, memory, ports = node_usage(state, name)
        mine = [a for a in state.allocations.values() if a.node == name]
        assert cores <= node.inventory.cpu_cores
        assert memory <= node.inventory.memory_mb
        assert len(ports) == len(mine), f"a port handed out twice on {name}"
        assert all(node.port_min <= p <= node.port_max for p in ports)


@given(nodes(), st.lists(requests(), min_size=5, max_size=30), st.randoms(use_true_random=False))
def test_placement_keeps_its_promises(records, reqs, rnd):
    state = LedgerState(nodes=records)
    for i, req in enumerate(reqs):
        req = req.model_copy(update={"replica_id": f"{req.model}-{i}"})
        candidates = eligible(state, req)
        decision = place(state, req)
        if isinstance(decision, PlacementRefused):
            assert not candidates
            # Every node is accounted for, each in its own words.
            expected = set(state.nodes) or {"(cluster)"}
            assert set(decision.reasons) == expected
            assert all(decision.reasons.values())
            for name, reason in decision.reasons.items():
                if name in state.nodes:
                    assert reason == why_not(state, state.nodes[name], req)
            continue
        assert decision.node in candidates
        node = state.nodes[decision.node]
        assert node.state == NodeState.READY and not node.cordoned
        assert node.engines[req.engine].state == EngineState.INSTALLED
        assert (decision.cpu_cores, decision.memory_mb) == (req.cpu_cores, req.memory_mb)
        assert decision.address == node.inventory.address
        # CPU replicas spread: the chosen node has the fewest replicas of all that could take it.
        assert replicas_on(state, decision.node) == min(replicas_on(state, n) for n in candidates)
        state.allocations[req.replica_id] = decision
        check_invariants(state)
        # Placement is idempotent per replica.
        assert place(state, req) == decision
        # Now and then a replica goes away and gives back what it held.
        if state.allocations and rnd.random() < 0.3:
            gone = rnd.choice(sorted(state.allocations))
            del state.allocations[gone]


def ready_node(name: str, cores: int) -> NodeRecord:
    return NodeRecord(
        inventory=NodeInventory(name=name, cpu_cores=cores, memory_mb=65536),
        state=NodeState.READY,
        engines={
            "llamacpp": EngineStatus(engine="llamacpp", version="1", state=EngineState.INSTALLED)
        },
    )


def request(replica_id: str, cpu_cores: int = 1, engine_version: str = "") -> PlacementRequest:
    return PlacementRequest(
        replica_id=replica_id,
        model="m",
        engine="llamacpp",
        engine_version=engine_version,
        cpu_cores=cpu_cores,
        memory_mb=64,
    )


@given(st.lists(st.integers(4, 32), min_size=1, max_size=5), st.integers(1, 20))
def test_identical_requests_spread_evenly_over_nodes(cores, count):
    state = LedgerState(nodes={f"n{i}": ready_node(f"n{i}", c) for i, c in enumerate(cores)})
    for i in range(count):
        req = request(f"m-{i}")
        decision = place(state, req)
        if isinstance(decision, PlacementRefused):
            # Only once every node is full.
            assert all(
                replicas_on(state, n) == node.inventory.cpu_cores for n, node in state.nodes.items()
            )
            continue
        assert isinstance(decision, Allocation)
        state.allocations[req.replica_id] = decision
    per_node = Counter(a.node for a in state.allocations.values())
    open_nodes = [n for n, node in state.nodes.items() if per_node[n] < node.inventory.cpu_cores]
    # Nodes that still have room differ by at most one replica.
    if open_nodes:
        counts = [per_node[n] for n in open_nodes]
        assert max(counts) - min(counts) <= 1
        # A node that filled up did so while level with the others, so it is at most one ahead.
        assert all(per_node[n] <= max(counts) + 1 for n in state.nodes)


def test_an_empty_cluster_says_no_node_has_registered():
    decision = place(LedgerState(), request("m-0"))
    assert decision == PlacementRefused(
        replica_id="m-0", reasons={"(cluster)": "no nodes have registered"}
    )


def test_refusal_reasons_name_what_is_missing():
    installing = ready_node("b", 8)
    installing.engines["llamacpp"] = EngineStatus(
        engine="llamacpp", version="1", state=EngineState.INSTALLING, detail="building 45%"
    )
    state = LedgerState(
        nodes={
            "a": ready_node("a", 1),
            "b": installing,
            "c": ready_node("c", 8).model_copy(update={"cordoned": True}),
            "d": ready_node("d", 8).model_copy(update={"state": NodeState.LOST}),
        }
    )
    decision = place(state, request("m-0", cpu_cores=2, engine_version="1"))
    assert isinstance(decision, PlacementRefused)
    assert decision.reasons == {
        "a": "1 of 1 CPU cores free, 2 wanted",
        "b": "llamacpp installing: building 45%",
        "c": "node is cordoned",
        "d": "node is lost",
    }
