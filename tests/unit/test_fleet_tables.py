"""The fleet tables on both stores (store/fleet/): placement committed in one transaction never
double-books, even with two control workers racing; gateways read routes by version, and are
sent only what changed."""

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from activities.control.fleet_activities import FleetActivities
from bench.placement import double_booked
from bench.simulated_fleet import replica_mix, simulated_node
from store.fleet import Conflict, FleetTables, open_fleet
from tests.unit.test_store import BACKENDS, backend_named
from workflows.contracts import (
    Allocation,
    EngineState,
    EngineStatus,
    ModelName,
    NodeInventory,
    NodeRecord,
    NodeState,
    PlacementRefusal,
    PlacementRequest,
    Profile,
    ReplicaState,
    Route,
    RoutingTableRequest,
)
from workflows.names import replica_id, replica_workflow_id

Opener = Callable[[], Awaitable[FleetTables]]


@pytest.fixture(params=BACKENDS)
async def open_tables(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    """Opens handles on one database, as separate control workers and gateways would."""
    async with backend_named(request.param, tmp_path) as backend:
        opened: list[FleetTables] = []

        async def open_one() -> FleetTables:
            tables = open_fleet(backend.url, backend.state_dir)
            await tables.init()
            opened.append(tables)
            return tables

        yield open_one
        for tables in opened:
            await tables.close()


def cpu_node(name: str, cores: int = 8, state: NodeState = NodeState.READY) -> NodeRecord:
    inventory = NodeInventory(name=name, address="10.0.0.1", cpu_cores=cores, memory_mb=16384)
    llamacpp = EngineStatus(
        engine="llamacpp", version="1", state=EngineState.INSTALLED, path="/x/llama-server"
    )
    return NodeRecord(inventory=inventory, state=state, engines={"llamacpp": llamacpp})


def cpu_request(model: str, index: int, cores: int = 2) -> PlacementRequest:
    profile = Profile(engine="llamacpp", cpu_cores=cores, memory_mb=1024)
    return PlacementRequest(
        replica_id=replica_id(model, index),
        workflow_id=replica_workflow_id(model, index),
        model=model,
        profiles=[profile],
    )


def ready_route(rid: str, node: str, model: str = "m") -> Route:
    return Route(
        replica_id=rid,
        model=model,
        node=node,
        endpoint=f"http://10.0.0.1:{18000 + len(rid)}",
        engine="llamacpp",
        state=ReplicaState.READY,
    )


async def test_two_control_workers_racing_never_double_book(open_tables: Opener) -> None:
    """Two placers with their own memory and connections place 8 replicas at a time on the
    same small GPU fleet: every GPU and port is held once, and every replica that fits is
    placed (the fleet holds more GPUs than the replicas need)."""
    first, second = FleetActivities(await open_tables()), FleetActivities(await open_tables())
    rng = random.Random(3)
    for i in range(12):
        await first.upsert_node(simulated_node(i, rng))
    replicas = replica_mix(40, rng)
    queue = list(replicas)

    async def lane(n: int) -> list[Allocation | PlacementRefusal]:
        placer = (first, second)[n % 2]
        answers: list[Allocation | PlacementRefusal] = []
        while queue:
            answers.append(await placer.place(queue.pop().request))
        return answers

    answers = [
        a for lane_answers in await asyncio.gather(*map(lane, range(8))) for a in lane_answers
    ]
    state = await first.tables.snapshot()
    assert double_booked(state) == []
    placed = [a for a in answers if isinstance(a, Allocation)]
    assert {a.replica_id for a in placed} == set(state.allocations)
    assert len(placed) == len(replicas), [a for a in answers if not isinstance(a, Allocation)]


async def test_a_placement_is_idempotent_and_a_full_node_refuses_with_its_reason(
    open_tables: Opener,
) -> None:
    fleet = FleetActivities(await open_tables())
    await fleet.upsert_node(cpu_node("n1", cores=4))
    first = await fleet.place(cpu_request("m", 0, cores=3))
    again = await fleet.place(cpu_request("m", 0, cores=3))
    assert isinstance(first, Allocation)
    assert again == first  # a retried activity gets the allocation it has
    refused = await fleet.place(cpu_request("m", 1, cores=3))
    assert isinstance(refused, PlacementRefusal)
    assert "n1" in refused.summary
    assert "core" in refused.summary


async def test_another_workers_release_is_seen_before_refusing(open_tables: Opener) -> None:
    """A placer whose memory says the node is full looks at the tables again before it
    refuses: another control worker freed the cores meanwhile."""
    one, other = FleetActivities(await open_tables()), FleetActivities(await open_tables())
    await one.upsert_node(cpu_node("n1", cores=4))
    held = await one.place(cpu_request("m", 0, cores=4))
    assert isinstance(held, Allocation)
    assert isinstance(await other.place(cpu_request("m", 1, cores=4)), PlacementRefusal)
    await one.tables.release(held.replica_id)
    assert isinstance(await other.place(cpu_request("m", 1, cores=4)), Allocation)


async def test_a_commit_on_a_node_changed_since_its_decision_writes_nothing(
    open_tables: Opener,
) -> None:
    tables = await open_tables()
    await tables.upsert_node(cpu_node("n1"))
    rev, _ = (await tables.node_revs())["n1"]
    fleet = FleetActivities(tables)
    alloc = await fleet.place(cpu_request("m", 0))
    assert isinstance(alloc, Allocation)
    stale = alloc.model_copy(update={"replica_id": "m-9", "port": alloc.port + 1})
    with pytest.raises(Conflict):
        # The node moved on since `rev`, and another placer wrote it.
        await tables.commit_placement(stale, {"n1": rev}, "another-placer")
    current, writer = (await tables.node_revs())["n1"]
    assert writer == fleet.placer.id
    same_port = alloc.model_copy(update={"replica_id": "m-8", "shards": []})
    with pytest.raises(Conflict):  # the port's claim is held: refused whatever the rev
        await tables.commit_placement(same_port, {"n1": current}, "another-placer")
    assert set((await tables.snapshot()).allocations) == {alloc.replica_id}


async def test_a_gateway_is_sent_nothing_new_then_only_what_changed(open_tables: Opener) -> None:
    writer, gateway = await open_tables(), await open_tables()
    await writer.upsert_node(cpu_node("n1"))
    await writer.upsert_node(cpu_node("n2"))
    for i in range(3):
        await writer.set_route(ready_route(f"m-{i}", "n1" if i < 2 else "n2"))
    whole = await gateway.routing_table(None)
    assert {r.replica_id for r in whole.routes} == {"m-0", "m-1", "m-2"}
    held = RoutingTableRequest(epoch=whole.epoch, version=whole.version, deltas=True)
    assert (await gateway.routing_table(held)).unchanged
    # Saying the same again changes nothing a gateway sees.
    assert not await writer.set_route(ready_route("m-0", "n1"))
    assert (await gateway.routing_table(held)).unchanged
    await writer.set_route(ready_route("m-1", "n1").model_copy(update={"detail": "busy"}))
    await writer.set_route(ready_route("m-2", "n2").model_copy(update={"state": "stopped"}))
    delta = await gateway.routing_table(held)
    assert delta.delta
    assert delta.since == whole.version
    assert [r.replica_id for r in delta.routes] == ["m-1"]
    assert delta.removed == ["m-2"]


async def test_a_node_that_stops_serving_withdraws_its_routes_and_gets_them_back(
    open_tables: Opener,
) -> None:
    tables = await open_tables()
    await tables.upsert_node(cpu_node("n1"))
    await tables.upsert_node(cpu_node("n2"))
    await tables.set_route(ready_route("m-0", "n1"))
    await tables.set_route(ready_route("m-1", "n2"))
    before = await tables.routing_table(None)
    held = RoutingTableRequest(epoch=before.epoch, version=before.version, deltas=True)
    await tables.upsert_node(cpu_node("n1", state=NodeState.UNREACHABLE))
    delta = await tables.routing_table(held)
    assert [(r.replica_id, r.node_unreachable) for r in delta.routes] == [("m-0", True)]
    await tables.upsert_node(cpu_node("n1", state=NodeState.LOST))
    (lost,) = (await tables.routing_table(held)).routes
    assert lost.state == ReplicaState.RESTARTING  # routable no more, whatever it said
    await tables.upsert_node(cpu_node("n1"))
    back = await tables.routing_table(None)
    assert {r.replica_id: r.state for r in back.routes} == {
        "m-0": ReplicaState.READY,
        "m-1": ReplicaState.READY,
    }


async def test_a_gateway_behind_the_pruned_tombstones_reads_the_whole_table(
    open_tables: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    from store.fleet import tables as fleet_tables

    monkeypatch.setattr(fleet_tables, "PRUNE_EVERY", 10)
    monkeypatch.setattr(fleet_tables, "KEEP_VERSIONS", 20)
    tables = await open_tables()
    await tables.set_route(ready_route("kept", "n1"))
    start = await tables.routing_table(None)
    held = RoutingTableRequest(epoch=start.epoch, version=start.version, deltas=True)
    for i in range(30):
        await tables.set_route(ready_route(f"gone-{i}", "n1"))
        await tables.set_route(
            ready_route(f"gone-{i}", "n1").model_copy(update={"state": "stopped"})
        )
    answer = await tables.routing_table(held)
    # The whole table, not a delta with holes.
    assert not answer.delta
    assert not answer.unchanged
    assert [r.replica_id for r in answer.routes] == ["kept"]


async def test_idle_models_reach_gateways_with_a_new_version(open_tables: Opener) -> None:
    tables = await open_tables()
    start = await tables.routing_table(None)
    assert await tables.set_idle("sleepy", True)
    assert not await tables.set_idle("sleepy", True)
    held = RoutingTableRequest(epoch=start.epoch, version=start.version, deltas=True)
    assert (await tables.routing_table(held)).idle_models == ["sleepy"]


async def test_two_workers_placing_the_same_replicas_agree_on_one_allocation_each(
    open_tables: Opener,
) -> None:
    """A placement retried on another control worker while the first still runs: both race
    the same replicas, and each replica ends with one allocation, which both were given."""
    first, second = FleetActivities(await open_tables()), FleetActivities(await open_tables())
    for i in range(4):
        await first.upsert_node(cpu_node(f"n{i}", cores=16))
    requests = [cpu_request("m", i) for i in range(24)]
    answers = await asyncio.gather(
        *(worker.place(req) for req in requests for worker in (first, second))
    )
    state = await first.tables.snapshot()
    assert set(state.allocations) == {req.replica_id for req in requests}
    assert double_booked(state) == []
    for answer in answers:
        assert isinstance(answer, Allocation)
        assert answer == state.allocations[answer.replica_id]


async def test_a_write_cancelled_part_way_leaves_the_store_usable(tmp_path: Path) -> None:
    """An activity cancelled (a timeout, a worker stopping) while its transaction is on the
    store's thread: nothing of it is kept, and the next write goes through."""
    tables = open_fleet(None, tmp_path)
    await tables.init()
    try:
        for _ in range(20):
            write = asyncio.create_task(tables.set_route(ready_route("m-0", "n1")))
            await asyncio.sleep(0)
            write.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await write
        assert await tables.set_idle("m", True)
        assert (await tables.snapshot()).idle_models == ["m"]
    finally:
        await tables.close()


async def test_a_models_routes_reach_its_workflow_small_whatever_their_details(
    open_tables: Opener,
) -> None:
    """What a model workflow reads of its routes (adoption after a terminate) lands in its
    history: which replicas, where, in which state and profile, and no detail, adapters or KV
    source, so the 5,000 replicas of one model stay under Temporal's 2 MB payload limit."""
    fleet = FleetActivities(await open_tables())
    await fleet.upsert_node(cpu_node("n1"))
    for i in range(200):
        route = ready_route(f"m-{i}", "n1").model_copy(
            update={"detail": "x" * 500, "adapters": [f"adapter-{a}" for a in range(20)]}
        )
        await fleet.set_route(route.model_copy(update={"fingerprint": f"fp{i}"}))
    table = await fleet.model_routes(ModelName(name="m"))
    assert {(r.replica_id, r.node, r.state, r.fingerprint) for r in table.routes} == {
        (f"m-{i}", "n1", ReplicaState.READY, f"fp{i}") for i in range(200)
    }
    per_route = len(table.model_dump_json()) / len(table.routes)
    assert per_route * 5_000 < 2_000_000 * 0.6
