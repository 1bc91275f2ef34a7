"""Session affinity by rendezvous (highest random weight) hashing.

Each (session, replica) pair gets a score and the session goes to its highest-scoring replica.
When a replica leaves, only the sessions it owned move (each to its own second choice); when one
joins, it takes only the sessions it now outscores. Modulo hashing would reshuffle nearly every
session on any change and throw away every engine's cache for them.

The score is blake2b, not Python's `hash`, so every gateway process agrees on a session's
replica without sharing state.
"""

from __future__ import annotations

from collections.abc import Sequence
from hashlib import blake2b


def score(session: str, replica_id: str) -> int:
    # surrogatepass: a session is client text, and text that is not valid Unicode must still
    # route somewhere rather than raise after the request's quota was reserved.
    data = session.encode("utf-8", "surrogatepass") + b"\x00" + replica_id.encode()
    digest = blake2b(data, digest_size=8, person=b"llmgw-rdv").digest()
    return int.from_bytes(digest, "big")


def owner(session: str, replica_ids: Sequence[str]) -> int | None:
    """The index in `replica_ids` of the session's replica, or None when there is none."""
    best: int | None = None
    best_score = -1
    for index, replica_id in enumerate(replica_ids):
        value = score(session, replica_id)
        # Ties (2**-64 apart) go to the smaller id, so the answer never depends on order.
        if value > best_score or (
            best is not None and value == best_score and replica_id < replica_ids[best]
        ):
            best, best_score = index, value
    return best
