"""What this gateway tells the others, gathered between two flushes of the peer bus.

The router, its eviction record and its breaker call these on the request path: each call
appends one short list and returns (no I/O, no encoding: the bus encodes a whole batch every
FLUSH_S off the request path). The items are those gateway/peers/picture.py applies. Bounded:
past MAX_ITEMS unflushed (a bus that cannot keep up) new items are dropped and counted, and the
next batch tells the peers to ask for a snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MAX_ITEMS = 100_000


class PeerOutbox:
    def __init__(self, max_items: int = MAX_ITEMS) -> None:
        self.max_items = max_items
        self._items: list[list[Any]] = []
        self.dropped = 0  # items dropped since the start
        self.overflowed = False  # items were dropped since the last take

    def __len__(self) -> int:
        return len(self._items)

    def take(self) -> list[list[Any]]:
        items, self._items = self._items, []
        self.overflowed = False
        return items

    def _add(self, item: list[Any]) -> None:
        if len(self._items) >= self.max_items:
            self.dropped += 1
            self.overflowed = True
            return
        self._items.append(item)

    # Router (policy.py PrefixOutbox)
    def prefix_sent(self, replica_id: str, keys: Sequence[int]) -> None:
        self._add(["p", replica_id, list(keys)])

    # KvPressure (kv_pressure.py PressureListener)
    def kv_sent(
        self, replica_id: str, ticket: int, blocks: Sequence[int], unhashed: int, need: int
    ) -> None:
        self._add(["ks", replica_id, ticket, list(blocks), unhashed, need])

    def kv_started(self, replica_id: str, ticket: int) -> None:
        self._add(["kt", replica_id, ticket])

    def kv_finished(self, replica_id: str, ticket: int) -> None:
        self._add(["kf", replica_id, ticket])

    # SlotBoard (slot_cache.py SlotListener)
    def slot_sent(self, replica_id: str, ticket: int, slots: int, keys: Sequence[int]) -> None:
        self._add(["ss", replica_id, ticket, slots, list(keys)])

    def slot_finished(self, replica_id: str, ticket: int) -> None:
        self._add(["sf", replica_id, ticket])

    # CircuitBreaker (breaker.py BreakerListener)
    def breaker_changed(self, replica_id: str, open_for_s: float) -> None:
        self._add(["b", replica_id, open_for_s])
