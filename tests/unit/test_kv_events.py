"""vLLM's KV-cache events off the wire: both encodings vLLM has used, both hash forms, and
frames that are not events, which are refused without harm."""

import pickle

import msgpack
import pytest

from kv.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    MalformedEvent,
    UnknownEvent,
    decode_message,
)
from kv.hashes import block_digests, block_ids

TOKENS = list(range(1, 33))
BIG = 2**64 - 5  # above 2**63: must be read unsigned


def message(events: list[object], seq: int = 7, rank: object = 0) -> list[bytes]:
    payload = msgpack.packb([1733000000.5, events, rank])
    return [b"kv@model", seq.to_bytes(8, "big"), payload]


def test_a_map_encoded_batch_as_vllm_0_32_sends_it() -> None:
    ids = block_ids(TOKENS, 16, "0")
    stored = {
        "type": "BlockStored",
        "block_hashes": ids,
        "parent_block_hash": None,
        "token_ids": TOKENS,
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": None,
        "group_idx": 0,
    }
    batch = decode_message(message([stored, {"type": "BlockRemoved", "block_hashes": [BIG]}]))
    assert batch.seq == 7
    assert batch.topic == b"kv@model"
    assert batch.data_parallel_rank == 0
    assert batch.events == [
        BlockStored(ids, None, TOKENS, 16, None, "GPU"),
        BlockRemoved([BIG]),
    ]


def test_an_array_encoded_batch_as_older_vllm_sends_it_of_any_length() -> None:
    short = ["BlockStored", [BIG], 12, [5, 6], 2]
    long = ["BlockStored", [1], None, [7, 8], 2, None, "GPU", "sql-lora", "later", "fields"]
    batch = decode_message(message([short, long, ["BlockRemoved", [1]], ["AllBlocksCleared"]]))
    assert batch.events == [
        BlockStored([BIG], 12, [5, 6], 2),
        BlockStored([1], None, [7, 8], 2, "sql-lora", "GPU"),
        BlockRemoved([1]),
        AllBlocksCleared(),
    ]


def test_raw_digests_become_the_same_ids_as_integer_hashes() -> None:
    digests = block_digests(TOKENS, 16, "0")
    raw = {"type": "BlockStored", "block_hashes": digests, "token_ids": TOKENS, "block_size": 16}
    [event] = decode_message(message([raw])).events
    assert isinstance(event, BlockStored)
    assert event.block_ids == block_ids(TOKENS, 16, "0")


def test_an_unknown_kind_of_event_is_reported_not_guessed() -> None:
    batch = decode_message(message([{"type": "BlockMoved", "x": 1}, ["Future", 1, 2]]))
    assert batch.events == [UnknownEvent("BlockMoved"), UnknownEvent("Future")]


@pytest.mark.parametrize(
    ("frames", "words"),
    [
        ([b"t", b"\x00" * 8], "3 frames"),
        ([b"t", b"\x00" * 4, msgpack.packb([0.0, [], 0])], "8 bytes"),
        ([b"t", b"\x00" * 8, b"\xc1"], "not msgpack"),
        ([b"t", b"\x00" * 8, msgpack.packb([0.0, [], 0]) + b"\x00"], "not msgpack"),
        ([b"t", b"\x00" * 8, pickle.dumps({"type": "AllBlocksCleared"})], "not msgpack"),
        ([b"t", b"\x00" * 8, msgpack.packb(msgpack.ExtType(1, b"x"))], "extension type"),
        ([b"t", b"\x00" * 8, msgpack.packb({"a": 1})], "[timestamp, events, rank]"),
        ([b"t", b"\x00" * 8, msgpack.packb(["now", [], 0])], "timestamp"),
        ([b"t", b"\x00" * 8, msgpack.packb([0.0, {}, 0])], "events are not a list"),
    ],
)
def test_frames_that_are_not_kv_events_are_refused(frames: list[bytes], words: str) -> None:
    with pytest.raises(MalformedEvent, match=words.replace("[", r"\[").replace("]", r"\]")):
        decode_message(frames)


@pytest.mark.parametrize(
    ("event", "words"),
    [
        ({"block_hashes": [1]}, "no 'type'"),
        (42, "neither a map nor a tagged array"),
        ({"type": "BlockStored", "block_hashes": [-1], "token_ids": [], "block_size": 16}, "hash"),
        (
            {"type": "BlockStored", "block_hashes": [1.5], "token_ids": [], "block_size": 1},
            "hash",
        ),
        (
            {"type": "BlockStored", "block_hashes": [b"short"], "token_ids": [], "block_size": 1},
            "hash",
        ),
        (
            {"type": "BlockStored", "block_hashes": 1, "token_ids": [], "block_size": 1},
            "not a list",
        ),
        ({"type": "BlockStored", "block_hashes": [], "token_ids": ["a"], "block_size": 1}, "token"),
        (
            {"type": "BlockStored", "block_hashes": [], "token_ids": [], "block_size": 0},
            "block_size",
        ),
        (
            {"type": "BlockStored", "block_hashes": [], "token_ids": [], "block_size": True},
            "block_size",
        ),
        ({"type": "BlockRemoved", "block_hashes": [1], "medium": 3}, "medium"),
    ],
)
def test_events_with_wrong_fields_are_refused(event: object, words: str) -> None:
    with pytest.raises(MalformedEvent, match=words):
        decode_message(message([event]))


def test_a_huge_declared_length_is_refused_before_it_is_allocated() -> None:
    # An array header claiming 2**32-1 items, with nothing behind it.
    payload = b"\x93\xcb" + b"\x00" * 8 + b"\xdd\xff\xff\xff\xff"
    with pytest.raises(MalformedEvent, match="not msgpack"):
        decode_message([b"t", b"\x00" * 8, payload])
