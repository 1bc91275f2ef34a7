"""Routing table as deltas: what the ledger's route log answers (workflows/route_log.py) and
how a gateway applies it (gateway/route_book.py). Pure: no Temporal."""

import random

import pytest
from pydantic_core import to_json

from bench.simulated_fleet import route_for
from gateway.route_book import RouteBook, add_page, apply_delta, follows, start_book
from workflows.contracts import (
    Allocation,
    LedgerState,
    PlacementRequest,
    Profile,
    ReplicaState,
    Route,
    RoutingTable,
    RoutingTableRequest,
)
from workflows.route_log import (
    LOG_LIMIT,
    PAGE_ROUTES,
    answer,
    forget_changes,
    note_change,
    page,
)

EPOCH = "ledger-1"


def route(replica: str, node: str = "n1", state: ReplicaState = ReplicaState.READY) -> Route:
    return Route(
        replica_id=replica,
        model="m",
        node=node,
        endpoint=f"http://{node}:8000/{replica}",
        engine="vllm",
        state=state,
    )


def served(r: Route) -> Route:
    return r


def ask(state: LedgerState, held: RouteBook | None, after: str = "") -> RoutingTable:
    request = held.asking() if held is not None else RoutingTableRequest(deltas=True, after=after)
    return answer(state, request, EPOCH, served)


class Ledger:
    """The ledger's handlers, as far as gateways see them: version bumped on every change, the
    log told what changed routes."""

    def __init__(self) -> None:
        self.state = LedgerState(route_log_floor=0)

    def set_route(self, r: Route) -> None:
        self.state.version += 1
        self.state.routes[r.replica_id] = r
        note_change(self.state, replica_id=r.replica_id)

    def release(self, replica: str) -> None:
        self.state.version += 1
        if self.state.routes.pop(replica, None) is not None:
            note_change(self.state, replica_id=replica)

    def place(self) -> None:
        self.state.version += 1  # an allocation: no route changes

    def node_state(self, node: str) -> None:
        self.state.version += 1
        note_change(self.state, node=node)


def read_whole(state: LedgerState) -> RouteBook:
    first = ask(state, None)
    book = start_book(first)
    cursor = first.next_after
    while cursor:
        later = ask(state, None, after=cursor)
        add_page(book, later)
        cursor = later.next_after
    return book


# --- the ledger's side ---------------------------------------------------------------------


def test_a_placement_sends_nothing_but_the_new_version() -> None:
    ledger = Ledger()
    ledger.set_route(route("a"))
    book = read_whole(ledger.state)
    ledger.place()
    ledger.place()
    reply = ask(ledger.state, book)
    assert reply.unchanged
    assert not reply.routes
    assert reply.version == ledger.state.version == book.version + 2


def test_a_delta_holds_the_changed_routes_and_the_removed_ids() -> None:
    ledger = Ledger()
    for name in ("a", "b", "c"):
        ledger.set_route(route(name))
    book = read_whole(ledger.state)
    ledger.set_route(route("b", state=ReplicaState.STOPPING))
    ledger.release("c")
    ledger.set_route(route("d"))
    reply = ask(ledger.state, book)
    assert reply.delta
    assert reply.since == book.version
    assert [r.replica_id for r in reply.routes] == ["b", "d"]
    assert reply.removed == ["c"]


def test_a_node_change_resends_every_route_on_that_node() -> None:
    ledger = Ledger()
    ledger.set_route(route("a", node="n1"))
    ledger.set_route(route("b", node="n1"))
    ledger.set_route(route("c", node="n2"))
    book = read_whole(ledger.state)
    ledger.node_state("n1")
    reply = ask(ledger.state, book)
    assert sorted(r.replica_id for r in reply.routes) == ["a", "b"]
    # A node with no routes on it changing state sends nothing.
    book = apply_delta(book, reply)
    assert book is not None
    ledger.node_state("n3")
    assert ask(ledger.state, book).unchanged


def test_the_log_is_bounded_and_an_asker_behind_it_is_sent_the_whole_table() -> None:
    ledger = Ledger()
    ledger.set_route(route("first"))
    book = read_whole(ledger.state)
    for i in range(LOG_LIMIT + 10):
        ledger.set_route(
            route(f"r{i % 50}", state=[ReplicaState.READY, ReplicaState.LOADING][i % 2])
        )
    assert len(ledger.state.route_log) == LOG_LIMIT
    reply = ask(ledger.state, book)
    assert not reply.delta, "too far behind: a first page"
    assert not reply.unchanged
    # One entry behind the log's start is still answered with a delta.
    near = RouteBook(EPOCH, ledger.state.route_log_floor or 0)
    assert ask(ledger.state, near).delta


def test_another_epoch_or_a_forgotten_log_gets_the_whole_table() -> None:
    ledger = Ledger()
    ledger.set_route(route("a"))
    book = read_whole(ledger.state)
    stranger = answer(ledger.state, book.asking().model_copy(update={"epoch": "x"}), EPOCH, served)
    assert not stranger.delta
    assert [r.replica_id for r in stranger.routes] == ["a"]
    ledger.state.version += 1
    forget_changes(ledger.state)  # a change made by a ledger from before the log
    reply = ask(ledger.state, book)
    assert not reply.delta
    assert not reply.unchanged


def test_pages_cover_the_table_once_each_and_stay_small_at_40000_routes() -> None:
    """40,000 routes as bench/simulated_fleet.py publishes them: the whole table is several
    MB, far past a query answer; each page stays under a fifth of the 2 MB payload limit."""
    state = LedgerState(route_log_floor=0)
    profile = Profile(engine="vllm", gpu_class="h100-80g", gpus_per_node=1, cpu_cores=4)
    for i in range(40_000):
        model = f"vllm-h100-x1-m{i // 20:04d}"
        alloc = Allocation(
            replica_id=f"{model}-{i % 20}",
            model=model,
            node=f"gpu-{i // 4:04d}",
            address=f"10.{i // 65536}.{(i // 256) % 256}.{i % 256}",
            port=8000 + i % 4,
            cpu_cores=4,
            memory_mb=32_768,
        )
        req = PlacementRequest(replica_id=alloc.replica_id, model=model, profiles=[profile])
        state.routes[alloc.replica_id] = route_for(alloc, req)
    whole = len(to_json(RoutingTable(routes=list(state.routes.values()))))
    assert whole > 4 * 1024 * 1024, f"the whole table is {whole} bytes"
    seen: list[str] = []
    biggest = 0
    after = ""
    while True:
        reply = page(state, after, EPOCH, served)
        biggest = max(biggest, len(to_json(reply)))
        assert len(reply.routes) <= PAGE_ROUTES
        seen += [r.replica_id for r in reply.routes]
        after = reply.next_after
        if not after:
            break
    assert seen == sorted(state.routes)
    assert biggest < 400 * 1024, f"a page is {biggest} bytes"


# --- the gateway's side --------------------------------------------------------------------


def test_a_delta_updates_and_removes_routes_in_the_book() -> None:
    book = RouteBook(EPOCH, 5, {"a": route("a"), "b": route("b")})
    delta = RoutingTable(
        version=7,
        epoch=EPOCH,
        delta=True,
        since=5,
        routes=[route("a", state=ReplicaState.STOPPING), route("c")],
        removed=["b"],
        idle_models=["sleepy"],
    )
    after = apply_delta(book, delta)
    assert after is not None
    assert after is not book
    assert after.version == 7
    assert after.idle_models == ["sleepy"]
    assert {k: v.state for k, v in after.routes.items()} == {
        "a": ReplicaState.STOPPING,
        "c": ReplicaState.READY,
    }
    assert set(book.routes) == {"a", "b"}, "the old book is left as it was"


def test_unchanged_moves_the_version_and_keeps_the_book() -> None:
    book = RouteBook(EPOCH, 5, {"a": route("a")})
    same = apply_delta(book, RoutingTable(version=9, epoch=EPOCH, unchanged=True))
    assert same is book
    assert book.version == 9


@pytest.mark.parametrize(
    "reply",
    [
        RoutingTable(version=9, epoch=EPOCH, delta=True, since=4, routes=[route("x")]),
        RoutingTable(version=9, epoch="ledger-2", delta=True, since=5),
        RoutingTable(version=9, epoch="ledger-2", unchanged=True),
        RoutingTable(version=3, epoch=EPOCH, unchanged=True),
        RoutingTable(version=9, epoch=EPOCH, routes=[route("x")]),  # a first page
    ],
    ids=["version-gap", "other-epoch", "other-epoch-unchanged", "older", "whole-table"],
)
def test_an_answer_that_does_not_follow_the_book_means_reading_it_whole(
    reply: RoutingTable,
) -> None:
    book = RouteBook(EPOCH, 5, {"a": route("a")})
    assert not follows(book, reply)
    assert apply_delta(book, reply) is None
    assert book.version == 5
    assert set(book.routes) == {"a"}


def test_a_page_from_another_ledger_is_not_mixed_in() -> None:
    book = start_book(RoutingTable(version=3, epoch=EPOCH, routes=[route("a")], next_after="a"))
    with pytest.raises(ValueError, match="ledger-2"):
        add_page(book, RoutingTable(version=1, epoch="ledger-2", routes=[route("b")]))


# --- both sides together -------------------------------------------------------------------


def test_a_gateway_following_deltas_holds_the_ledgers_table_through_churn() -> None:
    rng = random.Random(5)
    ledger = Ledger()
    book: RouteBook | None = None
    whole_reads = deltas = 0
    states = [ReplicaState.STARTING, ReplicaState.READY, ReplicaState.STOPPING]
    for step in range(3_000):
        roll = rng.random()
        replica = f"r{rng.randrange(300):03d}"
        if roll < 0.5:
            ledger.set_route(route(replica, node=f"n{rng.randrange(20)}", state=rng.choice(states)))
        elif roll < 0.7:
            ledger.release(replica)
        elif roll < 0.8:
            ledger.place()
        else:
            ledger.node_state(f"n{rng.randrange(20)}")
        # The gateway polls now and then: sometimes after a few changes, sometimes after many.
        if rng.random() < (0.3 if step < 2_000 else 0.001):
            reply = ask(ledger.state, book) if book is not None else None
            updated = apply_delta(book, reply) if book is not None and reply is not None else None
            if updated is None:
                book = read_whole(ledger.state)
                whole_reads += 1
            else:
                book = updated
                deltas += 1
            assert book.routes == ledger.state.routes
            assert book.version == ledger.state.version
    assert deltas > 100
    assert whole_reads >= 1
