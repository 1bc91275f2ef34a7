"""The agent's KV hub: what a gateway reading its feed ends up knowing, message by message."""

import random

import pytest

from activities.agent.kv.hub import FeedEnded, FeedReader, KvHub
from kv.events import AllBlocksCleared, BlockRemoved, BlockStored, UnknownEvent
from kv.feed import (
    MAX_BLOCKS_PER_LINE,
    MAX_LINE_BYTES,
    FeedLive,
    FeedMessage,
    FeedRemoved,
    FeedReset,
    FeedSnapshot,
    FeedStored,
    decode,
    encode,
)
from kv.index import KvBlockIndex


def stored(*blocks: int) -> BlockStored:
    return BlockStored(list(blocks), None, [1], 1)


def drain(reader: FeedReader) -> list[FeedMessage]:
    messages: list[FeedMessage] = []
    while batch := reader.take(7):  # a small batch size, so batches split the snapshot
        messages.extend(batch)
    return messages


def follow(messages: list[FeedMessage], max_blocks: int) -> tuple[KvBlockIndex, int]:
    """What a gateway does with the feed: checks the seq of every line, applies it to a fresh
    bounded index. Returns the index and the last seq."""
    snapshot = messages[0]
    assert isinstance(snapshot, FeedSnapshot)
    index = KvBlockIndex(max_blocks)
    seq = snapshot.seq
    live = False
    for message in messages[1:]:
        if not live:
            assert message.seq == seq, "the snapshot's lines all carry its seq"
            if isinstance(message, FeedLive):
                live = True
                continue
            assert isinstance(message, FeedStored)
            assert message.replica in snapshot.replicas
        else:
            assert message.seq == seq + 1, "each delta is the last seq plus one"
            seq = message.seq
        if isinstance(message, FeedStored):
            index.apply(message.replica, BlockStored(message.blocks, None, [], 1))
        elif isinstance(message, FeedRemoved):
            index.apply(message.replica, BlockRemoved(message.blocks))
        elif isinstance(message, FeedReset):
            index.reset(message.replica)
        else:
            raise AssertionError(f"unexpected {message}")
    assert live, "a snapshot ends with live"
    return index, seq


def same_as_hub(index: KvBlockIndex, hub: KvHub, replicas: list[str]) -> None:
    for replica in replicas:
        assert index.blocks(replica) == hub.blocks(replica), replica


async def test_a_reader_attached_mid_stream_rebuilds_exactly_what_the_hub_holds() -> None:
    rng = random.Random(7)
    bound = 60  # small, so evictions happen on both sides and must agree
    hub = KvHub(max_blocks=bound)
    replicas = ["m-0", "m-1", "m-2"]

    def churn(steps: int) -> None:
        for _ in range(steps):
            replica = rng.choice(replicas)
            roll = rng.random()
            if roll < 0.6:
                hub.apply(replica, [stored(*rng.sample(range(200), rng.randint(1, 30)))])
            elif roll < 0.9:
                hub.apply(replica, [BlockRemoved(rng.sample(range(200), rng.randint(1, 20)))])
            elif roll < 0.95:
                hub.apply(replica, [AllBlocksCleared()])
            else:
                hub.reset(replica)

    early = hub.attach()  # before anything: an empty snapshot, then every delta
    churn(100)
    late = hub.attach()
    snapshot = late.take(1)[0]
    assert isinstance(snapshot, FeedSnapshot)
    assert snapshot.seq == hub.seq
    assert snapshot.epoch == hub.epoch
    churn(100)

    # follow() checks the late reader's deltas start right after its snapshot's seq: a delta
    # lost or sent twice would also leave its index unlike the hub's.
    for messages in (drain(early), [snapshot, *drain(late)], drain(hub.attach())):
        index, last = follow(messages, bound)
        same_as_hub(index, hub, replicas)
        assert last == hub.seq


async def test_a_large_store_goes_out_in_lines_of_at_most_4096_blocks() -> None:
    hub = KvHub()
    reader = hub.attach()
    drain(reader)
    blocks = [2**64 - 1 - i for i in range(10_000)]  # 20-digit ids: the longest lines
    hub.apply("m-0", [stored(*blocks)])
    deltas = drain(reader)
    assert [len(m.blocks) for m in deltas if isinstance(m, FeedStored)] == [4096, 4096, 1808]
    assert [m.seq for m in deltas] == [1, 2, 3]
    snapshot = drain(hub.attach())
    lines = [m for m in snapshot if isinstance(m, FeedStored)]
    assert [len(m.blocks) for m in lines] == [4096, 4096, 1808]
    assert all(m.seq == 3 for m in snapshot)
    for message in deltas + snapshot:
        line = encode(message)
        assert len(line) <= MAX_LINE_BYTES
        assert decode(line) == message
    assert [b for m in lines for b in m.blocks] == blocks
    assert max(len(m.blocks) for m in lines) == MAX_BLOCKS_PER_LINE


async def test_cleared_reset_and_unknown_events_tell_readers_to_forget_the_replica() -> None:
    hub = KvHub()
    reader = hub.attach()
    drain(reader)
    hub.apply("m-0", [stored(1, 2, 3), AllBlocksCleared()])
    hub.apply("m-1", [stored(4)])
    hub.reset("m-1")
    hub.apply("m-2", [stored(5), UnknownEvent("BlockMoved")])
    assert drain(reader) == [
        FeedStored(1, "m-0", [1, 2, 3]),
        FeedReset(2, "m-0"),
        FeedStored(3, "m-1", [4]),
        FeedReset(4, "m-1"),
        FeedStored(5, "m-2", [5]),
        FeedReset(6, "m-2"),
    ]
    assert hub.blocks("m-0") == hub.blocks("m-1") == hub.blocks("m-2") == []


async def test_a_reader_that_falls_behind_is_cut_off_and_the_others_keep_going() -> None:
    hub = KvHub(max_pending=100)
    slow, keeping_up = hub.attach(), hub.attach()
    drain(slow)
    drain(keeping_up)
    for i in range(30):
        hub.apply("m-0", [stored(*range(i * 10, i * 10 + 9))])  # 9 blocks and the line: 10
        assert slow.overflowed == (i >= 10)
        assert len(drain(keeping_up)) == 1
    assert slow.overflowed
    assert slow.ended.is_set()
    with pytest.raises(FeedEnded):
        slow.take(10)
    assert not keeping_up.ended.is_set()
    hub.detach(slow)
    assert hub.readers == 1


async def test_each_replica_holds_at_most_max_blocks_the_newest_kept() -> None:
    hub = KvHub(max_blocks=100)
    for start in range(0, 1000, 50):
        hub.apply("m-0", [stored(*range(start, start + 50))])
    hub.apply("m-1", [stored(*range(5000, 5150))])  # one event past the bound
    assert hub.blocks("m-0") == list(range(900, 1000))
    assert hub.blocks("m-1") == list(range(5050, 5150))
    snapshot = drain(hub.attach())
    assert sum(len(m.blocks) for m in snapshot if isinstance(m, FeedStored)) == 200
    status = hub.status()["replicas"]
    assert isinstance(status, dict)
    assert status["m-0"]["blocks"] == status["m-1"]["blocks"] == 100
