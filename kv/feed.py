"""The KV feed: how a node agent tells gateways which prefix-cache blocks its replicas hold.

The agent subscribes to each local vLLM replica's KV events (kv/subscriber.py)
and keeps what every replica holds; a gateway reads `GET FEED_PATH` on the agent with
`Authorization: Bearer <kv_feed_token(node secret)>` and gets newline-delimited JSON, one
message per line:

    {"type": "snapshot", "epoch": E, "seq": S, "replicas": [...]}   what follows replaces all
    {"type": "stored", "seq": S, "replica": R, "blocks": [...]}     of the snapshot (seq S)
    {"type": "live", "seq": S}                                       end of the snapshot
    {"type": "stored", "seq": S+1, "replica": R, "blocks": [...]}   then deltas, seq + 1 each
    {"type": "removed", "seq": S+2, "replica": R, "blocks": [...]}
    {"type": "reset", "seq": S+3, "replica": R}                      forget all R held
    {"type": "ping", "seq": S+3}                                     while quiet: seq unchanged

`epoch` is new with every agent process: sequence numbers count within one. A delta whose seq
is not the last one plus one means the gateway missed something; it drops what the feed told
it and reconnects for a new snapshot (so does an agent that falls behind a slow gateway: it
closes the connection rather than buffer without bound). Block ids are vLLM's unsigned 64-bit
event ids (kv/hashes.py), at most MAX_BLOCKS_PER_LINE a line.

Pure: messages to bytes and back; no socket here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

FEED_PATH = "/kv/v1/feed"
MAX_BLOCKS_PER_LINE = 4096
# A line of MAX_BLOCKS_PER_LINE 20-digit ids, a replica id and the keys.
MAX_LINE_BYTES = MAX_BLOCKS_PER_LINE * 22 + 1024
# A quiet feed still sends a ping this often, so either end notices a dead connection.
PING_EVERY_S = 5.0
_U64 = (1 << 64) - 1


class MalformedFeed(ValueError):
    """A line that is not a KV feed message."""


@dataclass(frozen=True)
class FeedSnapshot:
    epoch: str
    seq: int
    replicas: list[str]


@dataclass(frozen=True)
class FeedStored:
    seq: int
    replica: str
    blocks: list[int]


@dataclass(frozen=True)
class FeedRemoved:
    seq: int
    replica: str
    blocks: list[int]


@dataclass(frozen=True)
class FeedReset:
    seq: int
    replica: str


@dataclass(frozen=True)
class FeedLive:
    seq: int


@dataclass(frozen=True)
class FeedPing:
    seq: int


FeedMessage = FeedSnapshot | FeedStored | FeedRemoved | FeedReset | FeedLive | FeedPing


def encode(message: FeedMessage) -> bytes:
    body: dict[str, Any]
    if isinstance(message, FeedSnapshot):
        body = {"type": "snapshot", "epoch": message.epoch, "seq": message.seq}
        body["replicas"] = message.replicas
    elif isinstance(message, FeedStored | FeedRemoved):
        if len(message.blocks) > MAX_BLOCKS_PER_LINE:
            raise ValueError(f"at most {MAX_BLOCKS_PER_LINE} blocks a line")
        kind = "stored" if isinstance(message, FeedStored) else "removed"
        body = {"type": kind, "seq": message.seq, "replica": message.replica}
        body["blocks"] = message.blocks
    elif isinstance(message, FeedReset):
        body = {"type": "reset", "seq": message.seq, "replica": message.replica}
    elif isinstance(message, FeedLive):
        body = {"type": "live", "seq": message.seq}
    else:
        body = {"type": "ping", "seq": message.seq}
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def chunks(blocks: list[int]) -> list[list[int]]:
    """`blocks` in pieces of at most MAX_BLOCKS_PER_LINE, for one line each."""
    return [
        blocks[i : i + MAX_BLOCKS_PER_LINE] for i in range(0, len(blocks), MAX_BLOCKS_PER_LINE)
    ] or [[]]


def decode(line: bytes) -> FeedMessage:
    """One line (with or without its newline) as a message; MalformedFeed otherwise."""
    if len(line) > MAX_LINE_BYTES:
        raise MalformedFeed(f"a line of {len(line)} bytes")
    try:
        body = json.loads(line)
    except ValueError as err:
        raise MalformedFeed(f"not JSON: {err}") from None
    if not isinstance(body, dict):
        raise MalformedFeed("a message is a JSON object")
    kind, seq = body.get("type"), _count(body.get("seq"), "seq")
    if kind == "snapshot":
        epoch, replicas = body.get("epoch"), body.get("replicas")
        if not isinstance(epoch, str) or not isinstance(replicas, list):
            raise MalformedFeed("a snapshot names its epoch and replicas")
        return FeedSnapshot(epoch, seq, [_name(r) for r in replicas])
    if kind in ("stored", "removed"):
        replica, blocks = _name(body.get("replica")), body.get("blocks")
        if not isinstance(blocks, list) or len(blocks) > MAX_BLOCKS_PER_LINE:
            raise MalformedFeed(f"blocks: a list of at most {MAX_BLOCKS_PER_LINE}")
        ids = [_block(b) for b in blocks]
        return FeedStored(seq, replica, ids) if kind == "stored" else FeedRemoved(seq, replica, ids)
    if kind == "reset":
        return FeedReset(seq, _name(body.get("replica")))
    if kind == "live":
        return FeedLive(seq)
    if kind == "ping":
        return FeedPing(seq)
    raise MalformedFeed(f"unknown message type {kind!r}")


def _count(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise MalformedFeed(f"{what}: a non-negative integer")
    return value


def _block(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _U64:
        raise MalformedFeed("a block id is an unsigned 64-bit integer")
    return value


def _name(value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > 256:
        raise MalformedFeed("a replica id is a non-empty string")
    return value
