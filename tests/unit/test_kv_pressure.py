"""What an engine will have evicted when a request sent now is started (gateway/routing/
kv_pressure.py), against vLLM's rule: new blocks come from blocks with no cached prefix first,
then idle cached blocks, least recently freed first, a request's last block first."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.routing.kv_pressure import KvPressure

R = "r1"


@dataclass
class Held:
    """A KV index stand-in: the blocks the replica's engine reports holding."""

    blocks: set[int] = field(default_factory=set)

    def size(self, replica_id: str) -> int:
        return len(self.blocks)

    def holds(self, replica_id: str, block: int) -> bool:
        return block in self.blocks


def finished(book: KvPressure, blocks: list[int]) -> None:
    ticket = book.sent(R, blocks, need=len(blocks), at=0.0)
    book.started(R, ticket)
    book.finished(R, ticket)


def test_nothing_waiting_ahead_evicts_nothing() -> None:
    book = KvPressure()
    index = Held({1, 2, 3, 4})
    finished(book, [1, 2, 3, 4])
    assert book.surviving(R, [1, 2, 3], capacity=4, index=index) == 3
    running = book.sent(R, [9], need=5, at=1.0)
    book.started(R, running)  # started: its blocks are already taken
    assert book.surviving(R, [1, 2, 3], capacity=4, index=index) == 3


def test_what_fits_in_the_free_blocks_evicts_nothing() -> None:
    book = KvPressure()
    index = Held({1, 2, 3, 4})
    finished(book, [1, 2, 3, 4])
    book.sent(R, [], need=6, at=1.0)  # 10 blocks, 4 cached: 6 free
    assert book.surviving(R, [1, 2, 3, 4], capacity=10, index=index) == 4
    assert book.surviving(R, [1, 2, 3, 4], capacity=None, index=index) == 4


def test_the_least_recently_freed_go_first_a_requests_last_block_first() -> None:
    book = KvPressure()
    index = Held({1, 2, 3, 11, 12, 13})
    finished(book, [1, 2, 3])  # freed as 3, 2, 1
    finished(book, [11, 12, 13])  # then 13, 12, 11
    book.sent(R, [], need=2, at=1.0)  # a full cache: takes the two oldest idle blocks, 3 then 2
    assert book.surviving(R, [1, 2, 3], capacity=6, index=index) == 1
    assert book.surviving(R, [11, 12, 13], capacity=6, index=index) == 3


def test_blocks_in_use_are_not_evicted() -> None:
    book = KvPressure()
    index = Held({1, 2, 3, 11, 12, 13})
    finished(book, [1, 2, 3])
    finished(book, [11, 12, 13])
    # A request of the first prefix is running: its blocks cannot go, the next oldest do.
    book.started(R, book.sent(R, [1, 2, 3], need=0, at=1.0))
    book.sent(R, [], need=2, at=1.0)
    assert book.surviving(R, [1, 2, 3], capacity=7, index=index) == 3
    assert book.surviving(R, [11, 12, 13], capacity=7, index=index) == 1


def test_blocks_of_unknown_age_go_before_known_ones() -> None:
    book = KvPressure()
    index = Held({1, 2, 3, 50, 51})  # 50 and 51: no request of this gateway freed them
    finished(book, [1, 2, 3])
    book.sent(R, [], need=1, at=1.0)
    assert book.surviving(R, [1, 2, 3], capacity=5, index=index) == 3
    book.sent(R, [], need=2, at=1.0)  # three in all: both unknown, then block 3
    assert book.surviving(R, [1, 2, 3], capacity=5, index=index) == 2
    assert book.surviving(R, [50, 51], capacity=5, index=index) == 0


def test_blocks_the_engine_dropped_are_forgotten() -> None:
    book = KvPressure()
    index = Held({1, 2, 3})
    finished(book, [1, 2, 3])
    index.blocks = {2, 3}  # the engine evicted block 1 (a BlockRemoved reached the index)
    book.sent(R, [], need=1, at=1.0)
    assert book.surviving(R, [2, 3], capacity=2, index=index) == 1  # 3, freed before 2, goes
    book.forget(R)
    # Both of unknown age now: one eviction could take either, two take both.
    assert book.surviving(R, [2, 3], capacity=2, index=index) == 2
    book.sent(R, [], need=1, at=1.0)
    assert book.surviving(R, [2, 3], capacity=2, index=index) == 0


def test_requests_not_streamed_sent_before_a_sample_with_none_waiting_count_as_started() -> None:
    book = KvPressure()
    index = Held({1, 2, 3})
    finished(book, [1, 2, 3])
    book.sent(R, [], need=2, at=5.0, streamed=False)  # no first bytes until it is done
    assert book.surviving(R, [1, 2, 3], capacity=3, index=index) == 1
    assert book.surviving(R, [1, 2, 3], capacity=3, index=index, started_before=4.0) == 1
    assert book.surviving(R, [1, 2, 3], capacity=3, index=index, started_before=6.0) == 3


def test_a_streamed_request_counts_as_started_only_at_its_first_bytes() -> None:
    """vLLM publishes a step's events as the step ends: a sample showing none waiting can come
    while the step that started it runs, its evictions not yet in the index."""
    book = KvPressure()
    index = Held({1, 2, 3})
    finished(book, [1, 2, 3])
    ticket = book.sent(R, [], need=2, at=5.0)
    assert book.surviving(R, [1, 2, 3], capacity=3, index=index, started_before=6.0) == 1
    book.started(R, ticket)
    assert book.surviving(R, [1, 2, 3], capacity=3, index=index) == 3


def test_blocks_a_request_did_not_hash_are_freed_before_its_hashed_ones() -> None:
    """A chat routed on its learned leading part hashed 2 of its 4 full blocks: the other two
    (its own question) are freed first, so they, not an older prefix, are evicted last."""
    book = KvPressure()
    index = Held({1, 2, 3, 11, 12, 98, 99})  # 98, 99: the chat's own blocks, never hashed here
    finished(book, [1, 2, 3])
    ticket = book.sent(R, [11, 12], need=4, at=1.0, full_blocks=4)
    book.started(R, ticket)
    book.finished(R, ticket)  # the free queue: 3 2 1, then 99 98 (as placeholders), 12 11
    book.sent(R, [], need=3, at=2.0)  # a full cache of 7: the three oldest go, all of 1 2 3
    assert book.surviving(R, [11, 12], capacity=7, index=index) == 2
    assert book.surviving(R, [1, 2, 3], capacity=7, index=index) == 0
    # Taken for blocks of unknown age (the oldest), 98 and 99 would have gone before 3 and 2.
    index.blocks -= {98}  # the engine evicted one of the two: the older placeholder is dropped
    book.sent(R, [], need=1, at=3.0)
    assert book.surviving(R, [11, 12], capacity=6, index=index) == 2
    assert book.surviving(R, [1, 2, 3], capacity=6, index=index) == 0


def test_a_running_requests_unhashed_blocks_are_not_idle() -> None:
    book = KvPressure()
    index = Held({1, 2, 3, 98, 99})
    finished(book, [1, 2, 3])
    running = book.sent(R, [], need=2, at=1.0, full_blocks=2)  # holds 98 and 99
    book.started(R, running)
    book.sent(R, [], need=1, at=2.0)
    # Not 98 or 99 (in use), but the oldest idle block: 3.
    assert book.surviving(R, [1, 2, 3], capacity=6, index=index) == 2


def test_blocks_a_request_ahead_will_store_are_counted_in_its_run() -> None:
    book = KvPressure()
    assert book.in_flight_run(R, [1, 2, 3]) == 0
    ahead = book.sent(R, [1, 2], need=3, at=1.0)
    assert book.in_flight_run(R, [1, 2, 3]) == 2
    assert book.in_flight_run(R, [2, 3]) == 1
    assert book.in_flight_run("other", [1, 2]) == 0
    book.finished(R, ahead)
    assert book.in_flight_run(R, [1, 2, 3]) == 0
