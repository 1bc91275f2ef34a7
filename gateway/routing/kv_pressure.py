"""What an engine will have evicted by the time a request sent now reaches it, for the cached
tokens a KV-routed request is predicted to find.

The KV index (engines/kv_index.py) says what an engine holds now. A request sent now is started
after those sent before it that the engine has not started yet, and vLLM gives each new block
from the front of its free queue: first blocks that hold no cached prefix, then cached blocks no
running request uses, least recently freed first (a finished request frees its blocks last one
first), and taking a cached block evicts it (vllm/v1/core/block_pool.py, 0.32). So once what the
requests ahead need passes what the engine has free, its oldest idle blocks go, and a prefix the
index shows can be gone when the request is started. The prediction counts only the leading
blocks that will still be there.

This is one gateway's view: the requests it sent (the first 128 blocks it hashed for each,
and whether the engine has started it: its first streamed bytes, or a metrics sample after it
showing none waiting), when each finished, and the engine's size in blocks from its metrics
(`vllm:cache_config_info`). Idle blocks no request of this gateway
freed (another gateway's, or older than this gateway) count as the oldest. Without the engine's
size the prediction is the index's alone.

Memory: a few ints per request in flight, and per replica one dict slot (about 80 bytes) per
block a finished request freed, dropped once the engine no longer holds it. The work, only
while the requests waiting ahead need more than the engine has free: one pass over those slots.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol


class HeldBlocks(Protocol):
    """The part of the KV index this reads."""

    def size(self, replica_id: str) -> int: ...

    def holds(self, replica_id: str, block: int) -> bool: ...


@dataclass(slots=True)
class _Sent:
    blocks: tuple[int, ...]  # its full blocks' ids as the gateway hashed them, in order
    need: int  # blocks it takes from the free queue when the engine starts it
    at: float  # when it was sent (the caller's monotonic clock)
    started: bool = False


class KvPressure:
    def __init__(self) -> None:
        # replica -> ticket -> a request sent there and not finished.
        self._sent: dict[str, dict[int, _Sent]] = {}
        # replica -> blocks finished requests freed, least recently freed first.
        self._freed: dict[str, dict[int, None]] = {}
        self._tickets = itertools.count()

    def sent(self, replica_id: str, blocks: Sequence[int], need: int, at: float) -> int:
        """A request was sent to the replica at `at`; its ticket for `started` and `finished`."""
        ticket = next(self._tickets)
        self._sent.setdefault(replica_id, {})[ticket] = _Sent(tuple(blocks), max(need, 0), at)
        return ticket

    def started(self, replica_id: str, ticket: int) -> None:
        """The engine started it (its first bytes came back): its blocks are allocated."""
        sent = self._sent.get(replica_id, {}).get(ticket)
        if sent is not None:
            sent.started = True

    def finished(self, replica_id: str, ticket: int) -> None:
        """Done, however it ended: its blocks go to the back of the engine's free queue, its
        last block first."""
        sent = self._sent.get(replica_id, {}).pop(ticket, None)
        if sent is None:
            return
        freed = self._freed.setdefault(replica_id, {})
        for block in reversed(sent.blocks):
            freed.pop(block, None)
            freed[block] = None

    def forget(self, replica_id: str) -> None:
        """Its engine's cache was reset: no block's age is known any more."""
        self._freed.pop(replica_id, None)

    def retain(self, replica_ids: Collection[str]) -> None:
        """Forget the replicas not in `replica_ids` (they left the routing table)."""
        for replica_id in [r for r in self._freed if r not in replica_ids]:
            del self._freed[replica_id]

    def surviving(
        self,
        replica_id: str,
        matched: Sequence[int],
        capacity: int | None,
        index: HeldBlocks,
        started_before: float | None = None,
    ) -> int:
        """How many of `matched` (a request's leading blocks the index shows the replica
        holding) its engine will still hold when it starts a request sent now, if its cache is
        `capacity` blocks. `started_before`: requests sent before then count as started (the
        engine's metrics, sampled then, showed none waiting): a request not streamed shows no
        first bytes until it is done."""
        if capacity is None or not matched:
            return len(matched)
        sent = list(self._sent.get(replica_id, {}).values())
        if started_before is not None:
            for s in sent:
                s.started = s.started or s.at <= started_before
        demand = sum(s.need for s in sent if not s.started)
        if demand == 0:
            return len(matched)
        held = index.size(replica_id)
        # Besides the cached blocks, each running request holds a block with no prefix yet.
        running = sum(s.started for s in sent)
        evicted = demand - max(capacity - held - running, 0)
        if evicted <= 0:
            return len(matched)
        in_use = {b for s in sent for b in s.blocks}
        freed = self._freed.get(replica_id, {})
        for block in [b for b in freed if not index.holds(replica_id, b)]:
            del freed[block]
        idle_known = [b for b in freed if b not in in_use]
        held_in_use = sum(index.holds(replica_id, b) for b in in_use)
        idle_unknown = held - held_in_use - len(idle_known)
        if evicted < idle_unknown:
            # Blocks of unknown age absorb it all; which of them go cannot be told.
            return len(matched)
        doomed = set(idle_known[: evicted - idle_unknown])
        for position, block in enumerate(matched):
            if block in doomed or (block not in in_use and block not in freed):
                return position  # evicted, or of unknown age with every such block gone
        return len(matched)
