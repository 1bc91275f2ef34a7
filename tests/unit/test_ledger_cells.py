"""The ledger split into cells (workflows/ledger_cells.py): every process puts a node in the
same cell, a placement goes to the best cell's offer, and the cells read back as one ledger."""

import subprocess
import sys
from collections import Counter

from workflows.contracts import (
    Allocation,
    LedgerState,
    NodeInventory,
    NodeRecord,
    PlacementOffer,
    ReplicaState,
    Route,
)
from workflows.ledger_cells import (
    cell_of_node,
    cell_of_route,
    home_cell,
    merge_routes,
    merge_states,
    offer_order,
    refusal_summary,
    split_state,
)
from workflows.names import EXTERNAL_NODE, ledger_cell_workflow_id


def node(name: str) -> NodeRecord:
    return NodeRecord(inventory=NodeInventory(name=name, cpu_cores=8, memory_mb=1024))


def route(rid: str, on: str, state: ReplicaState = ReplicaState.READY) -> Route:
    return Route(replica_id=rid, model="m", node=on, endpoint="", engine="llamacpp", state=state)


def alloc(rid: str, on: str) -> Allocation:
    return Allocation(
        replica_id=rid, node=on, address="10.0.0.1", port=8000, cpu_cores=1, memory_mb=1
    )


def offer(
    fits: bool, profile: int = 0, fetches: bool = False, held: bool = False
) -> PlacementOffer:
    return PlacementOffer(
        replica_id="r", fits=fits, profile_index=profile, fetches=fetches, held=held, summary="full"
    )


def test_a_node_has_the_same_cell_in_every_process_whatever_its_hash_seed():
    names = [f"gpu-{i:05d}" for i in range(50)]
    here = [cell_of_node(n, 7) for n in names]
    code = (
        "from workflows.ledger_cells import cell_of_node;"
        f"print([cell_of_node(n, 7) for n in {names!r}])"
    )
    for seed in ("1", "2"):
        other = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        )
        assert other.stdout.strip() == str(here)


def test_nodes_spread_evenly_over_cells_and_one_cell_is_the_cluster_workflow():
    counts = Counter(cell_of_node(f"node-{i}", 10) for i in range(10_000))
    assert set(counts) == set(range(10))
    assert max(counts.values()) < 1.1 * min(counts.values())
    assert all(cell_of_node(f"node-{i}", 1) == 0 for i in range(100))
    assert ledger_cell_workflow_id(0) == "cluster"
    assert ledger_cell_workflow_id(3) == "cluster:3"


def test_models_have_home_cells_spread_over_the_cells_the_same_in_every_process():
    homes = Counter(home_cell(f"model-{i}", 10) for i in range(10_000))
    assert set(homes) == set(range(10))
    assert max(homes.values()) < 1.2 * min(homes.values())
    assert home_cell("m", 3) == home_cell("m", 3) == 1  # crc32: no per-process hash seed
    assert home_cell("m", 1) == 0
    # Not the cell of a node of the same name: a model and a node may share one.
    assert [home_cell(f"gpu-{i}", 7) for i in range(20)] != [
        cell_of_node(f"gpu-{i}", 7) for i in range(20)
    ]


def test_pending_and_external_routes_live_in_cell_0():
    assert cell_of_route(route("r", ""), 8) == 0
    assert cell_of_route(route("r", EXTERNAL_NODE), 8) == 0
    on = next(f"n{i}" for i in range(100) if cell_of_node(f"n{i}", 8) == 5)
    assert cell_of_route(route("r", on), 8) == 5


def test_the_first_profile_that_fits_anywhere_wins_then_held_weights_then_the_lowest_cell():
    # Cell 0 fits only the second profile; cells 2 and 3 the first, 2 must fetch the weights.
    offers = [offer(True, profile=1), None, offer(True, fetches=True), offer(True), offer(False)]
    assert offer_order(offers) == [3, 2, 0]
    # Plain packing: the lowest cell that fits first.
    assert offer_order([offer(False), offer(True), offer(True)]) == [1, 2]
    # A retried placement goes back to the cell that placed it, whatever else fits.
    assert offer_order([offer(True), offer(True, profile=1, held=True)]) == [1, 0]
    assert offer_order([offer(False), None]) == []


def test_a_refusal_names_each_cell_and_stays_short():
    offers = [offer(False), None, offer(False)]
    assert refusal_summary(offers, 512) == (
        "cell 0: full; cell 1: no nodes have registered; cell 2: full"
    )
    assert refusal_summary([offer(False)], 512) == "full"
    long = refusal_summary([offer(False)] * 100, 120)
    assert len(long) == 120
    assert long.endswith("...")


def test_split_then_merged_is_the_ledger_it_was():
    state = LedgerState(idle_models=["sleepy"])
    names = [f"node-{i}" for i in range(40)]
    for n in names:
        state.nodes[n] = node(n)
    for i, n in enumerate(names):
        state.allocations[f"r{i}"] = alloc(f"r{i}", n)
        state.routes[f"r{i}"] = route(f"r{i}", n)
    state.routes["pending"] = route("pending", "", ReplicaState.PENDING)
    state.routes["ext"] = route("ext", EXTERNAL_NODE)

    parts = split_state(state, 4)

    assert [p.cell for p in parts] == [0, 1, 2, 3]
    assert all(p.cells == 4 for p in parts)
    for p in parts:
        assert all(cell_of_node(n, 4) == p.cell for n in p.nodes)
        # A replica's allocation and route are with its node.
        assert all(a.node in p.nodes for a in p.allocations.values())
        assert all(
            r.node in p.nodes for r in p.routes.values() if r.node not in ("", EXTERNAL_NODE)
        )
    assert {"pending", "ext"} <= set(parts[0].routes)
    assert parts[0].idle_models == ["sleepy"]
    assert not any(p.idle_models for p in parts[1:])
    merged = merge_states(parts)
    assert merged.nodes.keys() == state.nodes.keys()
    assert merged.allocations == state.allocations
    assert merged.routes == state.routes
    assert merged.idle_models == ["sleepy"]


def test_a_replica_placed_since_it_was_pending_reads_as_placed():
    """While a route moves out of cell 0 (set in its node's cell first, then withdrawn from
    cell 0), a reader holding both sees the placed one."""
    pending = route("r", "", ReplicaState.PENDING)
    placed = route("r", "gpu-7", ReplicaState.STARTING)
    assert merge_routes([[pending], [], [placed]])["r"] == placed
    cell0 = LedgerState(routes={"r": pending}, cells=3)
    cell2 = LedgerState(routes={"r": placed}, cells=3, cell=2)
    assert merge_states([cell0, cell2]).routes["r"] == placed
