"""A ledger split into cells (workflows/ledger_cells.py), on a real Temporal: each node, its
allocations and routes live in its own cell; placement fills a model's home cell, then the
others in turn, and never hands anything out twice; a replica's route leaves cell 0 once it is
placed elsewhere; gateways, `llmgw nodes` and the node workflows' calls see one ledger."""

import asyncio

import pytest
from temporalio.exceptions import ApplicationError

from activities.control.ledger_cluster import (
    LedgerActivities,
    allocate,
    place_replica,
    release,
    set_route,
    upsert_node,
)
from gateway.route_source import TemporalRouteSource
from tests.workflows.conftest import unique
from workers.ledger_commands import set_ledger_cells
from workers.progress import ledger_snapshot
from workflows.contracts import (
    Allocation,
    AllocationLookup,
    EngineState,
    EngineStatus,
    NodeInventory,
    NodeName,
    NodeRecord,
    NodeState,
    PlacementRequest,
    Profile,
    ReleaseRequest,
    ReplicaState,
    Route,
)
from workflows.ledger import CELLS_FIXED, NO_PLACEMENT, ClusterLedgerWorkflow
from workflows.ledger_cells import cell_of_node, home_cell
from workflows.ledger_compact import unpack_state
from workflows.names import ledger_cell_workflow_id

CELLS = 3


def ready_node(name: str) -> NodeRecord:
    return NodeRecord(
        inventory=NodeInventory(name=name, cpu_cores=2, memory_mb=16384),
        state=NodeState.READY,
        engines={
            "llamacpp": EngineStatus(
                engine="llamacpp", version="1", state=EngineState.INSTALLED, path="/x/llama"
            )
        },
    )


def one_core(replica: str) -> PlacementRequest:
    return PlacementRequest(
        replica_id=replica,
        model="m",
        profiles=[Profile(engine="llamacpp", engine_version="1", cpu_cores=1, memory_mb=64)],
    )


def nodes_by_cell(per_cell: int) -> dict[int, list[str]]:
    """Node names, `per_cell` of them in each cell."""
    cells: dict[int, list[str]] = {c: [] for c in range(CELLS)}
    while any(len(names) < per_cell for names in cells.values()):
        name = unique("gpu")
        names = cells[cell_of_node(name, CELLS)]
        if len(names) < per_cell:
            names.append(name)
    return cells


async def cell_state(client, cell: int):
    packed = await client.get_workflow_handle(ledger_cell_workflow_id(cell)).query(
        ClusterLedgerWorkflow.packed_snapshot
    )
    return unpack_state(packed)


async def test_a_ledger_in_cells_places_routes_and_releases_as_one(dev_cluster):
    client = dev_cluster.client
    assert (await set_ledger_cells(client, CELLS)).cells == CELLS
    by_cell = nodes_by_cell(2)
    await asyncio.gather(
        *(upsert_node(client, ready_node(n)) for ns in by_cell.values() for n in ns)
    )

    # Each cell holds its own nodes and no other's; the count can no longer change.
    for cell, names in by_cell.items():
        assert set((await cell_state(client, cell)).nodes) == set(names)
    with pytest.raises(ApplicationError) as fixed:
        await set_ledger_cells(client, CELLS + 1)
    assert fixed.value.type == CELLS_FIXED

    # Twelve cores in all, placed one at a time: the model's home cell fills first, then the
    # others in turn, lowest first.
    placed = [await allocate(client, one_core(f"r{i}")) for i in range(12)]
    cells_used = [cell_of_node(a.node, CELLS) for a in placed]
    home = home_cell("m", CELLS)
    others = [c for c in range(CELLS) if c != home]
    assert cells_used == [home] * 4 + [others[0]] * 4 + [others[1]] * 4
    assert len({(a.node, a.port) for a in placed}) == 12
    for alloc in placed:
        held = await client.get_workflow_handle(
            ledger_cell_workflow_id(cell_of_node(alloc.node, CELLS))
        ).query(ClusterLedgerWorkflow.holds, AllocationLookup(replica_id=alloc.replica_id))
        assert held.allocation
    # A retried placement gets what it has, from its cell, even while the cell the model's
    # last replica went to (tried first, with no query) has room.
    await release(client, ReleaseRequest(replica_id="r10"))
    assert await place_replica(client, one_core("r1"), retry=True) == placed[1]
    placed[10] = await allocate(client, one_core("r10"))
    assert cell_of_node(placed[10].node, CELLS) == others[1]
    # The thirteenth fits nowhere, and the refusal says so for each cell.
    with pytest.raises(ApplicationError) as refused:
        await allocate(client, one_core("r12"))
    assert refused.value.type == NO_PLACEMENT
    for cell in range(CELLS):
        assert f"cell {cell}: " in refused.value.message

    # Concurrent placements after a release still never share a core.
    await asyncio.gather(*(release(client, ReleaseRequest(replica_id=f"r{i}")) for i in (1, 5, 10)))
    again = await asyncio.gather(
        *(allocate(client, one_core(f"again{i}")) for i in range(3)), return_exceptions=True
    )
    assert all(isinstance(a, Allocation) for a in again)
    assert sorted(cell_of_node(a.node, CELLS) for a in again) == [0, 1, 2]  # type: ignore[union-attr]
    with pytest.raises(ApplicationError):
        await allocate(client, one_core("again3"))

    # A replica listed while pending (cell 0) moves to its node's cell once placed.
    last = placed[11]
    pending = Route(
        replica_id=last.replica_id,
        model="m",
        node="",
        endpoint="",
        engine="llamacpp",
        state=ReplicaState.PENDING,
    )
    await set_route(client, pending)
    assert last.replica_id in (await cell_state(client, 0)).routes
    source = TemporalRouteSource(client)
    assert [r.state for r in (await source.fetch()).routes] == [ReplicaState.PENDING]
    starting = pending.model_copy(
        update={
            "node": last.node,
            "endpoint": f"http://{last.address}:{last.port}",
            "state": ReplicaState.STARTING,
        }
    )
    await set_route(client, starting)
    assert last.replica_id not in (await cell_state(client, 0)).routes
    ready = starting.model_copy(update={"state": ReplicaState.READY})
    await set_route(client, ready)
    assert (await cell_state(client, others[1])).routes[last.replica_id] == ready
    # A gateway reads every cell and sees the replica once, ready on its node.
    table = await source.fetch()
    assert [(r.replica_id, r.state, r.node) for r in table.routes] == [
        (last.replica_id, ReplicaState.READY, last.node)
    ]
    assert table.cells == CELLS
    # Nothing changed: the same table, so the gateway rebuilds nothing.
    assert await source.fetch() is table

    # The node workflows' and models' calls find the right cell.
    ledger = LedgerActivities(client)
    status = await ledger.node_state(NodeName(name=last.node))
    assert status.state == NodeState.READY
    on_node = await ledger.replicas_on_node(NodeName(name=last.node))
    assert last.replica_id in {r.replica_id for r in on_node.replicas}
    found = await ledger.allocation(AllocationLookup(replica_id=last.replica_id))
    assert found.allocation == last
    names = await ledger.node_names()
    assert sorted(names.names) == sorted(n for ns in by_cell.values() for n in ns)

    # `llmgw nodes` and the console read the cells as one ledger.
    whole = await ledger_snapshot(client)
    assert len(whole.nodes) == 6
    assert len(whole.allocations) == 12
    assert list(whole.routes) == [last.replica_id]

    # Released, its route goes from every gateway's table.
    await release(client, ReleaseRequest(replica_id=last.replica_id))
    assert (await source.fetch()).routes == []
    assert last.replica_id not in (await ledger_snapshot(client)).allocations
