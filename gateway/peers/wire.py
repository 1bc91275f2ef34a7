"""The peer bus's frames: msgpack, signed with a key every gateway of the cluster derives from
its master secret (workflows/engine_keys.py `peer_bus_key`), so a process without it can
neither read its way in (a snapshot is given only to a signed request) nor inject a message.
What a frame carries is routing knowledge, not secrets: replica ids, keyed prefix hashes, engine
block ids, counts. It is not encrypted.

A frame is a 16-byte truncated HMAC-SHA256 of the body, then the body. Bodies:
- batch:    ["batch", peer, seq, items]            published to every peer
- ask:      ["ask", peer, nonce, want_index]       a snapshot request
- snapshot: ["snapshot", peer, nonce, snapshot]    the answer (picture.py `snapshot`)
The nonce ties an answer to its request, so an old answer cannot be replayed as a new one.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import msgpack

TAG_BYTES = 16
# Far above a whole prefix index (160,000 claims is a few MB): a bound, not a budget.
MAX_FRAME_BYTES = 256 * 1024 * 1024


class BadFrame(ValueError):
    """A frame that is not signed with this cluster's key, or not msgpack."""


def seal(key: bytes, body: list[Any]) -> bytes:
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return hmac.new(key, packed, hashlib.sha256).digest()[:TAG_BYTES] + packed


def unseal(key: bytes, frame: bytes) -> list[Any]:
    if len(frame) <= TAG_BYTES or len(frame) > MAX_FRAME_BYTES:
        raise BadFrame("frame too short or too long")
    tag, packed = frame[:TAG_BYTES], frame[TAG_BYTES:]
    if not hmac.compare_digest(tag, hmac.new(key, packed, hashlib.sha256).digest()[:TAG_BYTES]):
        raise BadFrame("bad signature")
    try:
        body = msgpack.unpackb(packed, raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise BadFrame(f"not msgpack: {exc}") from exc
    if not isinstance(body, list) or not body or not isinstance(body[0], str):
        raise BadFrame("not a peer bus message")
    return body
