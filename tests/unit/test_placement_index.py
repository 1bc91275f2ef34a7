"""The placer's PlacementIndex (activities/control/placer.py), kept across placements,
releases and node changes, decides exactly what checking every node from scratch decides, and
its usage is what the allocations hold."""

import random

from bench.simulated_fleet import replica_mix, simulated_node
from tests.unit.placement_kit import (
    check_cluster,
    cpu_profile,
    gpu,
    gpu_profile,
    h100s,
    node,
    req,
)
from workflows.artifact_names import artifact_hint
from workflows.contracts import (
    Allocation,
    LedgerState,
    NodeRecord,
    NodeState,
    PlacementRequest,
)
from workflows.placement import PlacementIndex, node_usage, place
from workflows.placement.compact import compact_record
from workflows.placement.place import _try

ARTIFACT = "sha256:" + "ab" * 32


def full_scan(state: LedgerState, request: PlacementRequest) -> Allocation | None:
    """Placement checking every node for every profile, as it did before the index."""
    fresh = PlacementIndex(state)
    for number, profile in enumerate(request.profiles):
        alloc, _ = _try(state, fresh, request, number, profile, request.exclude_nodes)
        if alloc is not None:
            return alloc
    return None


def holding(record: NodeRecord) -> NodeRecord:
    inventory = record.inventory.model_copy(update={"artifacts": [artifact_hint(ARTIFACT)]})
    return record.model_copy(update={"inventory": inventory})


def fleet(rng: random.Random) -> LedgerState:
    """Two racks of simulated HGX nodes (one NVLink domain with IMEX, one without), and a few
    odd ones: mixed classes, a broken GPU, CPU only, holding the model's weights."""
    state = LedgerState()
    for i in range(36):
        record = compact_record(simulated_node(i, rng))
        state.nodes[record.inventory.name] = record
    odd = [
        node("mixed", gpus=[gpu(0), gpu(1, "l40s-48g"), gpu(2), gpu(3, unusable="fell off")]),
        node("cpu-only", cores=32),
        holding(node("holder-a", gpus=h100s(4))),
        holding(node("holder-b", cores=16)),
    ]
    for record in odd:
        state.nodes[record.inventory.name] = record
    return state


def requests(rng: random.Random, count: int) -> list[PlacementRequest]:
    mix = [r.request for r in replica_mix(count, rng)]
    extra = [
        req("w1", gpu_profile(per_node=2), cpu_profile(4)),
        req("w2", cpu_profile(8)),
        req("w3", gpu_profile("l40s-48g")),
    ]
    for request in extra:
        request.artifact = ARTIFACT
    return mix + extra + [req("x", gpu_profile(per_node=1), exclude=["mixed", "gpu-0000"])]


def change_node(state: LedgerState, rng: random.Random) -> str:
    """Cordon, uncordon, mark unreachable or break a GPU on a random node, as upsert_node
    would replace its record."""
    name = rng.choice(sorted(state.nodes))
    record = state.nodes[name]
    what = rng.randrange(3)
    changed: NodeRecord
    if what == 0:
        changed = record.model_copy(update={"cordoned": not record.cordoned})
    elif what == 1:
        ready = record.state != NodeState.READY
        changed = record.model_copy(
            update={"state": NodeState.READY if ready else NodeState.UNREACHABLE}
        )
    else:
        gpus = [g.model_copy() for g in record.inventory.gpus]
        if gpus:
            gpus[rng.randrange(len(gpus))].unusable = "Xid 79"
        inventory = record.inventory.model_copy(update={"gpus": gpus})
        changed = record.model_copy(update={"inventory": inventory})
    state.nodes[name] = changed
    return name


def test_a_kept_index_places_as_a_full_scan_through_churn() -> None:
    rng = random.Random(7)
    state = fleet(rng)
    index = PlacementIndex(state)
    pending = requests(rng, 300)
    placed = refused = released = 0
    while pending:
        roll = rng.random()
        if roll < 0.2 and state.allocations:
            victim = rng.choice(sorted(state.allocations))
            index.remove(state.allocations.pop(victim))
            released += 1
            continue
        if roll < 0.27:
            index.node_changed(change_node(state, rng))
            continue
        request = pending.pop()
        expected = full_scan(state, request)
        decision = place(state, request, index)
        if expected is None:
            assert not isinstance(decision, Allocation), request.replica_id
            refused += 1
            continue
        assert decision == expected, request.replica_id
        state.allocations[decision.replica_id] = decision
        index.add(decision)
        placed += 1
        check_cluster(state)
    # The sequence exercised every path: placements of each kind, refusals and releases.
    assert placed > 100
    assert refused > 0
    assert released > 10
    for name in state.nodes:
        assert index.used(name) == node_usage(state, name), name


def test_weights_holders_come_first_and_others_still_fit() -> None:
    state = fleet(random.Random(3))
    index = PlacementIndex(state)
    first = place(state, requests(random.Random(3), 0)[0], index)  # w1, two H100s
    assert isinstance(first, Allocation)
    assert first.node == "holder-a"
    state.allocations[first.replica_id] = first
    index.add(first)
    request = req("w1b", gpu_profile(per_node=4))
    request.artifact = ARTIFACT
    # holder-a has two H100s left, not four: a node that must fetch the weights takes it.
    second = place(state, request, index)
    assert isinstance(second, Allocation)
    assert second.node != "holder-a"
    assert second == full_scan(state, request)


def test_releasing_one_of_two_allocations_on_a_node_frees_only_its_own() -> None:
    state = LedgerState(nodes={"a": node("a", gpus=h100s(4))})
    index = PlacementIndex(state)
    allocs = []
    for rid in ("r1", "r2"):
        alloc = place(state, req(rid, gpu_profile(per_node=2)), index)
        assert isinstance(alloc, Allocation)
        state.allocations[rid] = alloc
        index.add(alloc)
        allocs.append(alloc)
    index.remove(state.allocations.pop("r1"))
    assert index.used("a").gpus == set(allocs[1].shards[0].gpus)
    assert index.free_gpu_count("a", "h100-80g") == 2
    again = place(state, req("r3", gpu_profile(per_node=2)), index)
    assert isinstance(again, Allocation)
    assert again.shards[0].gpus == allocs[0].shards[0].gpus
