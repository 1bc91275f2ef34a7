"""Replica choice from a routing table (the least-load policy, the floor the others build on),
and keeping that table fresh."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.route_source import RouteRefresher, StoreRouteSource
from gateway.routing import RequestKey, Router, RoutingSnapshot
from store.fleet import FleetTables
from store.fleet import tables as fleet_tables
from store.fleet.db import SqliteDb
from store.fleet.schema import TABLES
from workflows.contracts import (
    NodeInventory,
    NodeRecord,
    NodeState,
    ReplicaState,
    Route,
    RoutingTable,
    RoutingTableRequest,
)

FLEET_TABLES = [t.split()[5] for t in TABLES if t.startswith("CREATE TABLE")]


def route(replica_id: str, model: str = "m", state: ReplicaState = ReplicaState.READY) -> Route:
    return Route(
        replica_id=replica_id,
        model=model,
        node="node-a",
        endpoint=f"http://127.0.0.1:1/{replica_id}",
        engine="llamacpp",
        state=state,
    )


def table(*routes: Route, version: int = 1) -> RoutingTable:
    return RoutingTable(version=version, routes=list(routes))


class LeastLoad:
    """The gateway's router on its least-load policy, asked as the proxy asks it."""

    def __init__(self, snap: RoutingSnapshot) -> None:
        self.snap = snap
        self.router = Router("least_load")

    def pick(
        self, model: str, inflight: dict[str, int], exclude: frozenset[str] = frozenset()
    ) -> Route | None:
        return self.router.choose(self.snap, RequestKey(model, b""), inflight, exclude).route


def test_only_ready_replicas_are_picked() -> None:
    snap = RoutingSnapshot(
        table(
            route("m-0", state=ReplicaState.LOADING),
            route("m-1"),
            route("m-2", state=ReplicaState.STOPPING),
        )
    )
    router = LeastLoad(snap)
    assert {router.pick("m", {}).replica_id for _ in range(5)} == {"m-1"}  # type: ignore[union-attr]


def test_a_replica_on_an_unreachable_node_is_a_last_resort() -> None:
    """The control plane cannot hear its node, so another ready replica is preferred; but with
    none other, its engine may well serve (only its agent may be down): better tried than a 503."""
    cut_off = route("m-0").model_copy(update={"node_unreachable": True})
    both = LeastLoad(RoutingSnapshot(table(cut_off, route("m-1"))))
    assert {both.pick("m", {"m-1": 9}).replica_id for _ in range(5)} == {"m-1"}  # type: ignore[union-attr]
    alone = LeastLoad(RoutingSnapshot(table(cut_off, route("m-1", state=ReplicaState.LOADING))))
    assert alone.pick("m", {}).replica_id == "m-0"  # type: ignore[union-attr]


def test_unknown_model_and_model_without_ready_replica_differ() -> None:
    snap = RoutingSnapshot(table(route("m-0", state=ReplicaState.STARTING)))
    router = LeastLoad(snap)
    assert router.pick("m", {}) is None
    assert snap.knows("m")
    assert router.pick("other", {}) is None
    assert not snap.knows("other")
    assert snap.models() == ["m"]


def test_least_in_flight_wins() -> None:
    snap = RoutingSnapshot(table(route("m-0"), route("m-1"), route("m-2")))
    router = LeastLoad(snap)
    picked = router.pick("m", {"m-0": 3, "m-1": 1, "m-2": 2})
    assert picked is not None
    assert picked.replica_id == "m-1"


def test_ties_rotate_round_robin() -> None:
    snap = RoutingSnapshot(table(route("m-0"), route("m-1"), route("m-2")))
    router = LeastLoad(snap)
    picks = [router.pick("m", {}) for _ in range(6)]
    assert [p.replica_id for p in picks if p] == ["m-0", "m-1", "m-2", "m-0", "m-1", "m-2"]
    # Among the tied least-loaded only: m-1 is busy, so m-0 and m-2 alternate.
    loads = Counter(p.replica_id for p in (router.pick("m", {"m-1": 5}) for _ in range(4)) if p)
    assert loads == {"m-0": 2, "m-2": 2}


def test_excluded_replicas_are_skipped() -> None:
    snap = RoutingSnapshot(table(route("m-0"), route("m-1")))
    router = LeastLoad(snap)
    picked = router.pick("m", {}, exclude=frozenset({"m-0"}))
    assert picked is not None
    assert picked.replica_id == "m-1"
    assert router.pick("m", {}, exclude=frozenset({"m-0", "m-1"})) is None


def test_models_are_kept_apart() -> None:
    snap = RoutingSnapshot(table(route("a-0", model="a"), route("b-0", model="b")))
    router = LeastLoad(snap)
    picked = router.pick("b", {})
    assert picked is not None
    assert picked.replica_id == "b-0"
    assert [r.replica_id for r in snap.ready("a")] == ["a-0"]


class FlakySource:
    def __init__(self) -> None:
        self.tables: list[RoutingTable | Exception] = []

    async def fetch(self) -> RoutingTable:
        item = self.tables.pop(0)
        if isinstance(item, Exception):
            raise item
        return item


async def test_refresher_keeps_the_last_good_table_when_the_source_fails() -> None:
    source = FlakySource()
    first = table(route("m-0"), version=3)
    source.tables = [first, ConnectionError("temporal down"), table(route("m-1"), version=4)]
    refresher = RouteRefresher(source)
    assert refresher.snapshot.models() == []
    assert await refresher.refresh()
    assert refresher.snapshot.version == 3
    assert not await refresher.refresh()
    assert refresher.snapshot.version == 3, "an outage keeps the last good table"
    assert refresher.last_error is not None
    assert "temporal down" in refresher.last_error
    assert await refresher.refresh()
    assert refresher.snapshot.version == 4
    assert refresher.last_error is None


async def test_ties_keep_rotating_across_routing_table_refreshes() -> None:
    source = FlakySource()
    same = table(route("m-0"), route("m-1"), route("m-2"))
    newer = table(route("m-0"), route("m-1"), route("m-2"), version=2)
    source.tables = [same, same.model_copy(), newer]
    refresher = RouteRefresher(source)
    router = Router("least_load")

    def pick() -> str:
        chosen = router.choose(refresher.snapshot, RequestKey("m", b""), {}).route
        assert chosen is not None
        return chosen.replica_id

    await refresher.refresh()
    first, snapshot = pick(), refresher.snapshot
    await refresher.refresh()
    assert refresher.snapshot is snapshot, "an unchanged table is not rebuilt"
    second = pick()
    await refresher.refresh()
    assert refresher.snapshot is not snapshot
    # The rotation lives in the router, so a new table does not send the next tie to m-0 again.
    assert [first, second, pick()] == ["m-0", "m-1", "m-2"]


class HangingSource:
    async def fetch(self) -> RoutingTable:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


async def test_a_hanging_source_times_out_instead_of_stalling_the_loop() -> None:
    refresher = RouteRefresher(HangingSource(), timeout_s=0.05)
    assert not await refresher.refresh()
    assert refresher.last_error is not None
    assert "TimeoutError" in refresher.last_error


class RecordedTables(FleetTables):
    """Fleet tables on a SQLite file that keep every answer they gave a gateway."""

    def __init__(self, path: Path) -> None:
        super().__init__(SqliteDb(path))
        self.answers: list[RoutingTable] = []

    async def routing_table(self, held: RoutingTableRequest | None = None) -> RoutingTable:
        answer = await super().routing_table(held)
        self.answers.append(answer)
        return answer


@pytest.fixture
async def tables(tmp_path: Path) -> AsyncIterator[RecordedTables]:
    made = RecordedTables(tmp_path / "fleet.db")
    await made.init()
    await made.upsert_node(
        NodeRecord(inventory=NodeInventory(name="node-a"), state=NodeState.READY)
    )
    yield made
    await made.close()


def held(t: RoutingTable) -> dict[str, ReplicaState]:
    return {r.replica_id: r.state for r in t.routes}


async def test_store_source_keeps_the_same_table_while_no_route_changes(
    tables: RecordedTables,
) -> None:
    await tables.set_route(route("m-0"))
    await tables.set_route(route("m-1"))
    source = StoreRouteSource(tables)
    first = await source.fetch()
    assert held(first) == dict.fromkeys(["m-0", "m-1"], ReplicaState.READY)
    assert first.version == (await tables.snapshot()).version
    # A replica saying again what it said changes nothing a gateway holds.
    assert not await tables.set_route(route("m-0"))
    again = await source.fetch()
    assert again is first, "nothing routed changed: the same table, not rebuilt"
    assert [a.unchanged for a in tables.answers] == [False, True]


async def test_store_source_applies_a_route_change_as_a_delta(tables: RecordedTables) -> None:
    await tables.set_route(route("m-0"))
    await tables.set_route(route("m-1"))
    await tables.set_route(route("m-2"))
    source = StoreRouteSource(tables)
    first = await source.fetch()
    await tables.set_route(route("m-1", state=ReplicaState.STOPPING))
    assert await tables.release("m-0")
    changed = await source.fetch()
    assert held(changed) == {"m-1": ReplicaState.STOPPING, "m-2": ReplicaState.READY}
    assert changed.version > first.version
    delta = tables.answers[-1]
    assert delta.delta
    assert delta.since == first.version
    # Only what changed was sent, not the whole table.
    assert [r.replica_id for r in delta.routes] == ["m-1"]
    assert delta.removed == ["m-0"]
    assert held(first) == dict.fromkeys(["m-0", "m-1", "m-2"], ReplicaState.READY)


async def test_store_source_reads_the_whole_table_of_a_wiped_store(
    tables: RecordedTables,
) -> None:
    """The store was wiped and made again (restored, or another database): its versions count
    from 0 again, and its epoch tells the gateway that its copy matches nothing there."""
    await tables.set_route(route("m-0"))
    await tables.set_route(route("m-1"))
    source = StoreRouteSource(tables)
    before = await source.fetch()
    async with tables.db.transaction() as tx:
        for name in FLEET_TABLES:
            await tx.execute(f"DROP TABLE {name}")
    await tables.init()
    await tables.upsert_node(
        NodeRecord(inventory=NodeInventory(name="node-a"), state=NodeState.READY)
    )
    # The new store's version passes the one the gateway holds, so only the epoch tells.
    while (await tables.snapshot()).version <= before.version:
        await tables.set_route(route("m-8"))
        await tables.release("m-8")
    await tables.set_route(route("m-9"))
    after = await source.fetch()
    assert after.epoch != before.epoch
    assert held(after) == {"m-9": ReplicaState.READY}
    # The store's first answer to a gateway holding another epoch is the whole table.
    assert not tables.answers[-1].delta
    assert not tables.answers[-1].unchanged


async def test_store_source_reads_the_whole_table_when_behind_the_pruned_tombstones(
    tables: RecordedTables, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fleet_tables, "PRUNE_EVERY", 10)
    monkeypatch.setattr(fleet_tables, "KEEP_VERSIONS", 20)
    await tables.set_route(route("kept"))
    source = StoreRouteSource(tables)
    await source.fetch()
    for i in range(30):
        await tables.set_route(route(f"gone-{i}"))
        await tables.release(f"gone-{i}")
    after = await source.fetch()
    assert held(after) == {"kept": ReplicaState.READY}
    assert after.version == (await tables.snapshot()).version
    assert not tables.answers[-1].delta


async def test_store_source_without_a_temporal_client_cannot_wake_a_model(
    tables: RecordedTables,
) -> None:
    with pytest.raises(RuntimeError, match="no Temporal client"):
        await StoreRouteSource(tables).wake("m")
