"""One picture for every gateway: what one gateway's router does, told through its outbox and
applied by another's picture (gateway/peers/), without sockets."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.peers.bus import attach
from gateway.peers.outbox import PeerOutbox
from gateway.peers.picture import STALE_S, SharedPicture, snapshot
from gateway.routing import LoadSample, RequestKey, Router, RoutingSnapshot
from gateway.routing.breaker import BreakerState
from gateway.routing.prefix_index import REFRESH_S, Claims, PrefixIndex
from workflows.contracts import ReplicaState, Route, RoutingTable

KEY = b"k" * 32
SYSTEM = b"You are the support assistant of a bicycle shop. Be brief. " * 25
OTHER = b"You summarise clinical trial reports for physicians. " * 25


def routes(*replica_ids: str) -> RoutingSnapshot:
    return RoutingSnapshot(
        RoutingTable(
            version=1,
            routes=[
                Route(
                    replica_id=r,
                    model="m",
                    node="n",
                    endpoint=f"http://127.0.0.1:1/{r}",
                    engine="llamacpp",
                    state=ReplicaState.READY,
                )
                for r in replica_ids
            ],
        )
    )


class Gateway:
    """A router wired as the bus wires it, with the batches it would send."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.router = Router(index=PrefixIndex(hash_key=KEY))
        self.outbox = PeerOutbox()
        self.picture = SharedPicture(self.router)
        attach(self.router, self.outbox, self.picture)
        self.seq = -1
        self.loads: dict[str, int] = {}

    def batch(self) -> tuple[int, list[list[Any]]]:
        self.seq += 1
        return self.seq, [*self.outbox.take(), ["l", dict(self.loads)]]

    async def snapshot(self, now: float) -> dict[str, Any]:
        return await snapshot(self.router, self.seq, dict(self.loads), now, index=True)


async def joined(a: Gateway, b: Gateway, now: float = 0.0) -> None:
    """b meets a and takes its snapshot, as the bus does when it finds a in the store."""
    b.picture.met(a.name, now)
    assert await b.picture.snapshot_of(a.name, await a.snapshot(now), now)


def tell(a: Gateway, b: Gateway, now: float) -> bool:
    seq, items = a.batch()
    return b.picture.batch(a.name, seq, items, now)


async def test_a_prefix_one_gateway_sent_is_followed_by_the_other() -> None:
    a, b = Gateway("a"), Gateway("b")
    await joined(a, b)
    snap = routes("r-0", "r-1", "r-2")
    first = a.router.choose(snap, RequestKey("m", SYSTEM + b"Q: my chain slips"), {}, now=1.0)
    assert first.route is not None
    assert tell(a, b, 1.0)
    # b never sent this prefix, yet routes its follow-up where a did, by prefix (a question
    # long enough to add blocks of its own, which b then tells: test below).
    follow = b.router.choose(snap, RequestKey("m", SYSTEM + b"Q: brakes squeal" * 20), {}, now=1.5)
    assert follow.reason == "prefix"
    assert follow.route is not None
    assert follow.route.replica_id == first.route.replica_id
    # And it says nothing back about it as its own: the outbox holds b's decision only.
    assert [item[0] for item in b.outbox.take()] == ["p"]


async def test_a_prompt_resent_within_the_refresh_interval_is_told_once() -> None:
    # An agent resending its context: the index takes it once per REFRESH_S, and so do the
    # other gateways, whose record of where it went is then as fresh as the sender's.
    a, b = Gateway("a"), Gateway("b")
    await joined(a, b)
    snap = routes("r-0", "r-1")
    prompt = SYSTEM + b"Q: my chain slips"
    kinds = []
    replicas = set()
    for now in (1.0, 1.0 + REFRESH_S / 2, 1.0 + REFRESH_S):
        decision = a.router.choose(snap, RequestKey("m", prompt), {}, now=now)
        assert decision.route is not None
        replicas.add(decision.route.replica_id)
        seq, items = a.batch()
        kinds.append([item[0] for item in items])
        assert b.picture.batch(a.name, seq, items, now)
    assert kinds == [["p", "l"], ["l"], ["p", "l"]]
    (replica,) = replicas
    keys = b.router.index.hashes(prompt)
    assert b.router.index.last_used(replica, keys) == a.router.index.last_used(replica, keys)
    assert b.router.index.last_used(replica, keys) == 1.0 + REFRESH_S


async def test_a_gateway_that_joins_late_gets_the_whole_record_in_its_snapshot() -> None:
    a, b = Gateway("a"), Gateway("b")
    snap = routes("r-0", "r-1", "r-2")
    placed = {}
    for n, system in enumerate((SYSTEM, OTHER)):
        decision = a.router.choose(snap, RequestKey("m", system + b"hello"), {}, now=float(n))
        assert decision.route is not None
        placed[system] = decision.route.replica_id
    a.outbox.take()
    # b starts after both were sent (a restarted gateway): the snapshot brings them.
    await joined(a, b, now=5.0)
    for system, replica_id in placed.items():
        found = b.router.choose(snap, RequestKey("m", system + b"again"), {}, now=6.0)
        assert (found.reason, found.route and found.route.replica_id) == ("prefix", replica_id)
    # Where new prefixes go counts what a sent too (working sets).
    assert b.router.working_sets.blocks(placed[SYSTEM], 6.0) > 0


async def test_batches_that_came_while_the_snapshot_was_awaited_apply_after_it() -> None:
    a, b = Gateway("a"), Gateway("b")
    b.picture.met(a.name, 0.0)
    a.router.kv.pressure.sent("r-0", [1, 2, 3], 3, 0.0)  # a ticket the snapshot will show
    a.outbox.take()
    a.seq += 1  # ... as already published
    taken = await a.snapshot(0.0)
    a.router.kv.pressure.sent("r-0", [1, 2, 4], 1, 0.1)  # after the snapshot
    seq, items = a.batch()
    assert b.picture.batch(a.name, seq, items, 0.1)  # buffered: b is not synced yet
    assert not b.picture.complete
    assert await b.picture.snapshot_of(a.name, taken, 0.2)
    assert b.picture.complete
    assert b.router.kv.pressure.in_flight_run("r-0", [1, 2, 4]) == 3
    assert b.router.kv.pressure.in_flight() == []  # a's requests are not b's own


async def test_a_peers_requests_in_flight_count_in_the_eviction_record_until_they_finish() -> None:
    a, b = Gateway("a"), Gateway("b")
    await joined(a, b)
    ticket = a.router.kv.pressure.sent("r-0", [10, 11], 2, 0.0)
    assert tell(a, b, 0.0)
    assert b.router.kv.pressure.in_flight_run("r-0", [10, 11]) == 2
    a.router.kv.pressure.started("r-0", ticket)
    a.router.kv.pressure.finished("r-0", ticket)
    assert tell(a, b, 0.1)
    assert b.router.kv.pressure.in_flight_run("r-0", [10, 11]) == 0


async def test_loads_count_while_every_peer_is_heard_and_not_after() -> None:
    a, b = Gateway("a"), Gateway("b")
    await joined(a, b)
    a.loads = {"r-0": 7}
    assert tell(a, b, 1.0)
    assert b.router.loads.others("r-0", 1.0) == 7
    assert b.router.loads.others("r-1", 1.0) == 0
    # Silent past STALE_S: its requests are no longer counted, and it is asked again.
    assert b.picture.expire(1.0 + STALE_S + 0.1) == ["a"]
    assert not b.picture.complete
    assert b.router.loads.others("r-0", 5.0) is None  # the engines' gauges, then


async def test_a_lost_batch_makes_the_picture_incomplete_until_a_new_snapshot() -> None:
    a, b = Gateway("a"), Gateway("b")
    await joined(a, b)
    a.router.kv.pressure.sent("r-0", [5], 1, 0.0)
    a.batch()  # lost on the way
    a.router.kv.pressure.sent("r-1", [6], 1, 0.1)
    assert not tell(a, b, 0.1)
    assert not b.picture.complete
    assert b.picture.gaps == 1
    assert await b.picture.snapshot_of(a.name, await a.snapshot(0.2), 0.2)
    assert b.picture.complete
    assert b.router.kv.pressure.in_flight_run("r-0", [5]) == 1
    assert b.router.kv.pressure.in_flight_run("r-1", [6]) == 1


async def test_a_replica_one_gateway_ejects_is_ejected_by_the_other_and_readmitted_with_it() -> (
    None
):
    a, b = Gateway("a"), Gateway("b")
    await joined(a, b)
    for _ in range(a.router.breaker.failures_to_open):
        a.router.breaker.failed("r-0", 10.0)
    assert tell(a, b, 10.0)
    assert b.router.breaker.state("r-0", 10.5) is BreakerState.OPEN
    a.router.breaker.succeeded("r-0", 20.0)
    assert tell(a, b, 20.0)
    assert b.router.breaker.state("r-0", 20.0) is BreakerState.CLOSED


async def test_a_peer_that_leaves_takes_its_requests_in_flight_and_leaves_its_prefixes() -> None:
    a, b = Gateway("a"), Gateway("b")
    await joined(a, b)
    snap = routes("r-0", "r-1")
    a.router.choose(snap, RequestKey("m", SYSTEM + b"x"), {}, now=0.0)
    a.router.kv.pressure.sent("r-0", [1], 1, 0.0)
    assert tell(a, b, 0.0)
    b.picture.left(a.name)
    assert b.router.kv.pressure.in_flight_run("r-0", [1]) == 0
    assert b.picture.complete  # no peer left to wait for
    found = b.router.choose(snap, RequestKey("m", SYSTEM + b"y"), {}, now=1.0)
    assert found.reason == "prefix"


async def test_items_it_does_not_understand_are_counted_and_skipped() -> None:
    a, b = Gateway("a"), Gateway("b")
    await joined(a, b)
    assert b.picture.batch(a.name, 0, [["zz", 1], ["p"], ["l", {"r-0": 2}]], 0.0)
    assert b.picture.malformed == 2
    assert b.router.loads.others("r-0", 0.0) == 2


def test_an_index_crosses_as_columns_and_is_read_in_steps() -> None:
    index = PrefixIndex(hash_key=KEY)
    for n in range(2_500):
        keys = index.hashes(f"prompt {n:05d} ".encode() * 200)  # 10 blocks each
        index.insert_hashes(f"r-{n % 3}", keys, float(n))
        if n % 10 == 0:
            index.insert_hashes("r-shared", keys[:2], float(n))  # nodes with two holders
    steps = list(index.claims_stepwise(2_500.0, step=5_000))
    assert steps[:-1] == [None] * (index.node_count // 5_000)
    claims = steps[-1]
    assert claims is not None
    assert len(claims.keys) == len(index)
    copy = PrefixIndex(hash_key=KEY)
    copy.learn(Claims.decode(claims.encode()), 2_500.0)
    assert len(copy) == len(index)
    probe = index.hashes(b"prompt 00010 " * 200)
    assert copy.longest_match_hashes(probe, ["r-1", "r-shared"]) == {"r-1": 10, "r-shared": 2}


def test_claims_whose_columns_disagree_are_refused() -> None:
    index = PrefixIndex(hash_key=KEY)
    index.insert_hashes("r-0", index.hashes(SYSTEM), 0.0)
    replicas, keys, holders, ages = index.claims(1.0).encode()
    with pytest.raises(ValueError, match="do not match"):
        Claims.decode([replicas, keys, holders[:-4], ages])
    with pytest.raises(ValueError, match="do not match"):
        Claims.decode([[], keys, holders, ages])  # a holder with no replica


async def test_the_engines_gauges_still_count_senders_off_the_bus() -> None:
    a, b = Gateway("a"), Gateway("b")
    # Alone, a gateway reads the engine's gauges, as before the bus.
    b.router.loads.record("r-0", LoadSample(running=5, waiting=0, kv_usage=None, taken_at=1.0))
    assert b.router.loads.others("r-0", 1.0) == 5
    await joined(a, b, now=1.0)
    a.loads = {"r-0": 2}
    assert tell(a, b, 1.0)
    # Five running by the engine, two of them a's: three from someone not on the bus.
    assert b.router.loads.others("r-0", 1.5) == 5
    a.loads = {"r-0": 9}  # a burst since the engine's last sample
    assert tell(a, b, 1.6)
    assert b.router.loads.others("r-0", 1.7) == 9


async def test_a_peers_requests_to_slot_cached_replicas_are_replayed_here() -> None:
    a, b = Gateway("a"), Gateway("b")
    await joined(a, b)
    system = a.router.index.hashes(SYSTEM)
    other = a.router.index.hashes(OTHER)
    # a sends the system prompt to r-0, whose two slots are its only cache.
    ticket = a.router.slots.sent("r-0", 2, system)
    assert tell(a, b, 0.0)
    # b replays it: the slot that holds the prompt is busy, so a second request of it would
    # take the other slot and find nothing.
    assert b.router.slots.view("r-0", 2, system).found == 0
    a.router.slots.finished("r-0", ticket)
    assert tell(a, b, 0.1)
    assert b.router.slots.view("r-0", 2, system).found == len(system)
    # b's own request of another prompt takes the other slot, and is told to nobody as a's.
    b.router.slots.sent("r-0", 2, other)
    assert [item[0] for item in b.outbox.take()] == ["ss"]
    assert b.router.slots.view("r-0", 2, system).found == len(system)
