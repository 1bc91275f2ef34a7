"""vLLM's KV-cache events, decoded from the wire: what a subscriber on the engine's publisher
receives (issue 13). Pure: frames in, events out; no socket here.

A message is three ZMQ frames: the topic, the sequence number (8 bytes, big-endian, unsigned;
it starts at 0 in every publisher process, so a restart resets it) and a msgpack payload: a
batch `[timestamp, [event, ...], data_parallel_rank]`. vLLM <= 0.23 encodes each event as an
array whose first element is its class name, of a length that varies by version; vLLM >= 0.24
as a map with the class name under "type" and default-valued fields left out. Both are read.
Block hashes are unsigned 64-bit integers (the default since vLLM 0.10.2) or the 32-byte digest
as bytes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0); both become the integer events carry.

Nothing is ever unpickled or evaluated: msgpack with extension types refused and every length
bounded. A frame that is not what vLLM sends raises MalformedEvent, for the subscriber to count
and drop; an event of a kind this code does not know comes back as UnknownEvent, so the
subscriber can count it and rebuild rather than keep an index that may be wrong."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import msgpack

from kv.hashes import DIGEST_BYTES, event_id

SEQ_BYTES = 8
# Bounds on one payload: a batch holds at most a few thousand events of a few hundred tokens,
# so these are far above what an engine sends and far below what would hurt the subscriber.
MAX_PAYLOAD_BYTES = 16 * 1024 * 1024
_MAX_ITEMS = 1_000_000


class MalformedEvent(ValueError):
    """A frame that is not a vLLM KV event: counted and dropped, never fatal."""


@dataclass(frozen=True)
class BlockStored:
    block_ids: list[int]
    parent_id: int | None
    token_ids: list[int]
    block_size: int
    lora_name: str | None = None
    medium: str | None = None


@dataclass(frozen=True)
class BlockRemoved:
    block_ids: list[int]
    medium: str | None = None


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


@dataclass(frozen=True)
class UnknownEvent:
    kind: str


Event = BlockStored | BlockRemoved | AllBlocksCleared | UnknownEvent


@dataclass(frozen=True)
class EventBatch:
    topic: bytes
    seq: int
    timestamp: float
    events: list[Event] = field(default_factory=list)
    data_parallel_rank: int | None = None


def decode_message(frames: Sequence[bytes]) -> EventBatch:
    """One published message: [topic, seq, payload]."""
    if len(frames) != 3:
        raise MalformedEvent(f"a KV event message has 3 frames, not {len(frames)}")
    topic, seq, payload = frames
    return decode_payload(topic, decode_seq(seq), payload)


def decode_seq(frame: bytes) -> int:
    if len(frame) != SEQ_BYTES:
        raise MalformedEvent(f"a sequence number is {SEQ_BYTES} bytes, not {len(frame)}")
    return int.from_bytes(frame, "big")


def decode_payload(topic: bytes, seq: int, payload: bytes) -> EventBatch:
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise MalformedEvent(f"a payload of {len(payload)} bytes is over {MAX_PAYLOAD_BYTES}")
    try:
        batch = msgpack.unpackb(
            payload,
            raw=False,
            strict_map_key=False,
            ext_hook=_refuse_ext,
            max_array_len=_MAX_ITEMS,
            max_map_len=_MAX_ITEMS,
            max_bin_len=MAX_PAYLOAD_BYTES,
            max_str_len=MAX_PAYLOAD_BYTES,
        )
    except MalformedEvent:
        raise
    except (ValueError, TypeError, msgpack.UnpackException) as err:
        # ExtraData, FormatError, StackError and out-of-bounds lengths are all ValueErrors; a
        # map keyed by an array is a TypeError (unhashable).
        raise MalformedEvent(f"not msgpack: {type(err).__name__}") from None
    if not isinstance(batch, list) or len(batch) < 2:
        raise MalformedEvent("a batch is [timestamp, events, rank]")
    timestamp, events = batch[0], batch[1]
    rank = batch[2] if len(batch) > 2 else None
    if not isinstance(timestamp, int | float) or isinstance(timestamp, bool):
        raise MalformedEvent("a batch's timestamp is not a number")
    if not isinstance(events, list):
        raise MalformedEvent("a batch's events are not a list")
    if rank is not None and not _is_int(rank):
        raise MalformedEvent("a batch's data-parallel rank is not an integer")
    return EventBatch(topic, seq, float(timestamp), [decode_event(e) for e in events], rank)


def decode_event(raw: object) -> Event:
    fields = _as_fields(raw)
    kind = fields["type"]
    if kind == "BlockStored":
        return BlockStored(
            block_ids=_hashes(fields.get("block_hashes")),
            parent_id=_optional_hash(fields.get("parent_block_hash")),
            token_ids=_ints(fields.get("token_ids"), "token_ids"),
            block_size=_positive(fields.get("block_size")),
            lora_name=_optional_str(fields.get("lora_name"), "lora_name"),
            medium=_optional_str(fields.get("medium"), "medium"),
        )
    if kind == "BlockRemoved":
        return BlockRemoved(
            block_ids=_hashes(fields.get("block_hashes")),
            medium=_optional_str(fields.get("medium"), "medium"),
        )
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return UnknownEvent(kind)


# Positional fields of the array form (vLLM <= 0.23), after the class name.
_POSITIONAL = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
    ),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


def _as_fields(raw: object) -> Mapping[str, Any]:
    if isinstance(raw, dict):
        kind = raw.get("type")
        if not isinstance(kind, str):
            raise MalformedEvent("an event map has no 'type'")
        return raw
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        names = _POSITIONAL.get(raw[0], ())
        # Newer versions append fields: those past the known ones are ignored.
        return {"type": raw[0], **dict(zip(names, raw[1:], strict=False))}
    raise MalformedEvent("an event is neither a map nor a tagged array")


def _refuse_ext(code: int, _data: bytes) -> object:
    raise MalformedEvent(f"msgpack extension type {code} is not part of a KV event")


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _hash(value: object) -> int:
    if _is_int(value) and 0 <= value < 2**64:
        return value
    if isinstance(value, bytes) and len(value) == DIGEST_BYTES:
        return event_id(value)
    raise MalformedEvent("a block hash is neither an unsigned 64-bit integer nor 32 bytes")


def _optional_hash(value: object) -> int | None:
    return None if value is None else _hash(value)


def _hashes(value: object) -> list[int]:
    if not isinstance(value, list):
        raise MalformedEvent("block_hashes is not a list")
    return [_hash(v) for v in value]


def _ints(value: object, name: str) -> list[int]:
    if isinstance(value, list) and all(_is_int(v) and v >= 0 for v in value):
        return value
    raise MalformedEvent(f"{name} is not a list of token ids")


def _positive(value: object) -> int:
    if _is_int(value) and value > 0:
        return value
    raise MalformedEvent("block_size is not a positive integer")


def _optional_str(value: object, name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise MalformedEvent(f"{name} is not a string")
