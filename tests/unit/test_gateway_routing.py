"""Replica choice from a routing table (the least-load policy, the floor the others build on),
and keeping that table fresh."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from gateway.route_source import RouteRefresher, TemporalRouteSource
from gateway.routing import RequestKey, Router, RoutingSnapshot
from workflows.contracts import ReplicaState, Route, RoutingTable, RoutingTableRequest
from workflows.ledger import ClusterLedgerWorkflow
from workflows.names import LEDGER_WORKFLOW_ID


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


class FakeHandle:
    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls: list[tuple[Any, Any, Any]] = []

    async def query(self, query: Any, *, args: Any, rpc_timeout: Any) -> Any:
        self.calls.append((query, args, rpc_timeout))
        return self.answer


class FakeClient:
    def __init__(self, handle: FakeHandle) -> None:
        self.handle = handle
        self.workflow_ids: list[str] = []

    def get_workflow_handle(self, workflow_id: str) -> FakeHandle:
        self.workflow_ids.append(workflow_id)
        return self.handle


async def test_temporal_source_queries_the_ledger_for_its_routing_table() -> None:
    expected = table(route("m-0"), version=7)
    client = FakeClient(FakeHandle(expected))
    source = TemporalRouteSource(client, rpc_timeout=timedelta(seconds=1))  # type: ignore[arg-type]
    assert await source.fetch() == expected
    assert client.workflow_ids == [LEDGER_WORKFLOW_ID]
    # The first ask holds nothing, and says it takes deltas and pages.
    ask = RoutingTableRequest(deltas=True)
    assert client.handle.calls == [
        (ClusterLedgerWorkflow.routing_table, [ask], timedelta(seconds=1))
    ]


class ScriptedHandle:
    """A ledger that answers each query with the next of its scripted answers."""

    def __init__(self, *answers: RoutingTable) -> None:
        self.answers = list(answers)
        self.asked: list[RoutingTableRequest] = []

    async def query(self, query: Any, *, args: Any, rpc_timeout: Any) -> Any:
        self.asked.append(args[0])
        return self.answers.pop(0)


async def test_temporal_source_pages_applies_deltas_and_rereads_after_a_gap() -> None:
    epoch = "ledger-1"
    handle = ScriptedHandle(
        # The whole table in two pages, then a delta for what changed while they were read.
        RoutingTable(version=4, epoch=epoch, routes=[route("m-0")], next_after="m-0"),
        RoutingTable(version=5, epoch=epoch, routes=[route("m-1")]),
        RoutingTable(version=6, epoch=epoch, delta=True, since=4, routes=[route("m-2")]),
        # A placement: nothing routed changed.
        RoutingTable(version=7, epoch=epoch, unchanged=True),
        # m-0 removed, m-1 draining.
        RoutingTable(
            version=8,
            epoch=epoch,
            delta=True,
            since=7,
            routes=[route("m-1", state=ReplicaState.STOPPING)],
            removed=["m-0"],
        ),
        # A delta from a version this gateway never held: read the whole table again.
        RoutingTable(version=12, epoch=epoch, delta=True, since=10, routes=[route("m-9")]),
        RoutingTable(version=12, epoch=epoch, routes=[route("m-1"), route("m-3")]),
    )
    source = TemporalRouteSource(FakeClient(handle))  # type: ignore[arg-type]

    def held(t: RoutingTable) -> dict[str, ReplicaState]:
        return {r.replica_id: r.state for r in t.routes}

    first = await source.fetch()
    assert held(first) == dict.fromkeys(["m-0", "m-1", "m-2"], ReplicaState.READY)
    assert first.version == 6
    assert handle.asked[1].after == "m-0"
    assert (handle.asked[2].epoch, handle.asked[2].version) == (epoch, 4)

    unchanged = await source.fetch()
    assert unchanged is first, "nothing routed changed: the same table, not rebuilt"
    assert unchanged.version == 7

    changed = await source.fetch()
    assert held(changed) == {"m-1": ReplicaState.STOPPING, "m-2": ReplicaState.READY}
    assert changed.version == 8

    reread = await source.fetch()
    assert held(reread) == {"m-1": ReplicaState.READY, "m-3": ReplicaState.READY}
    assert handle.asked[-1] == RoutingTableRequest(deltas=True)
    assert not handle.answers


async def test_temporal_source_refuses_a_wrongly_typed_answer() -> None:
    source = TemporalRouteSource(FakeClient(FakeHandle({"routes": []})))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await source.fetch()
