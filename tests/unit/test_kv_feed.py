"""The KV feed's lines: every message survives the trip, and a line that is not one is refused
(a gateway drops the connection on it rather than trust a broken feed)."""

import pytest

from kv.feed import (
    MAX_BLOCKS_PER_LINE,
    MAX_LINE_BYTES,
    FeedLive,
    FeedMessage,
    FeedPing,
    FeedRemoved,
    FeedReset,
    FeedSnapshot,
    FeedStored,
    MalformedFeed,
    chunks,
    decode,
    encode,
)

U64_MAX = 2**64 - 1


@pytest.mark.parametrize(
    "message",
    [
        FeedSnapshot("9f2c", 0, []),
        FeedSnapshot("9f2c", 17, ["qwen-0", "qwen-1"]),
        FeedStored(17, "qwen-0", [0, 1, U64_MAX]),
        FeedStored(17, "qwen-0", []),
        FeedRemoved(18, "qwen-1", [U64_MAX - 5]),
        FeedReset(19, "qwen-0"),
        FeedLive(17),
        FeedPing(19),
    ],
)
def test_every_message_round_trips_as_one_line(message: FeedMessage) -> None:
    line = encode(message)
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    assert decode(line) == message
    assert decode(line.rstrip(b"\n")) == message


def test_a_full_line_of_the_longest_ids_fits_the_limit() -> None:
    line = encode(FeedStored(2**63, "r" * 256, [U64_MAX] * MAX_BLOCKS_PER_LINE))
    assert len(line) <= MAX_LINE_BYTES
    assert len(decode(line).blocks) == MAX_BLOCKS_PER_LINE  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="at most 4096"):
        encode(FeedStored(1, "r", [1] * (MAX_BLOCKS_PER_LINE + 1)))
    assert [len(c) for c in chunks(list(range(9000)))] == [4096, 4096, 808]
    assert chunks([]) == [[]]


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b'{"type": "stored", "seq": 1', "not JSON"),
        (b"[1, 2]", "a JSON object"),
        (b'{"type": "moved", "seq": 1}', "unknown message type"),
        (b'{"type": "ping"}', "seq"),
        (b'{"type": "ping", "seq": -1}', "seq"),
        (b'{"type": "ping", "seq": 1.5}', "seq"),
        (b'{"type": "ping", "seq": true}', "seq"),
        (b'{"type": "stored", "seq": 1, "replica": "r", "blocks": [18446744073709551616]}', "64"),
        (b'{"type": "stored", "seq": 1, "replica": "r", "blocks": [-1]}', "64"),
        (b'{"type": "stored", "seq": 1, "replica": "r", "blocks": [true]}', "64"),
        (b'{"type": "stored", "seq": 1, "replica": "r", "blocks": ["7"]}', "64"),
        (b'{"type": "removed", "seq": 1, "replica": "r", "blocks": 7}', "blocks"),
        (b'{"type": "reset", "seq": 1, "replica": ""}', "replica id"),
        (b'{"type": "reset", "seq": 1, "replica": 5}', "replica id"),
        (b'{"type": "snapshot", "seq": 1, "replicas": []}', "epoch"),
        (b'{"type": "snapshot", "seq": 1, "epoch": "e", "replicas": [""]}', "replica id"),
    ],
)
def test_a_line_that_is_not_a_feed_message_is_refused(line: bytes, why: str) -> None:
    with pytest.raises(MalformedFeed, match=why):
        decode(line)


def test_a_line_over_the_limit_is_refused_before_it_is_parsed() -> None:
    blocks = ",".join(["1"] * (MAX_BLOCKS_PER_LINE + 1))
    too_many = f'{{"type":"stored","seq":1,"replica":"r","blocks":[{blocks}]}}'.encode()
    with pytest.raises(MalformedFeed, match="at most 4096"):
        decode(too_many)
    padded = b'{"type": "ping", "seq": 1' + b" " * MAX_LINE_BYTES + b"}"
    with pytest.raises(MalformedFeed, match="a line of"):
        decode(padded)
