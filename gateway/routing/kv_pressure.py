"""What an engine will have evicted by the time a request sent now reaches it, for the cached
tokens a KV-routed request is predicted to find.

The KV index (kv/index.py) says what an engine holds now. A request sent now is started
after those sent before it that the engine has not started yet, and vLLM gives each new block
from the front of its free queue: first blocks that hold no cached prefix, then cached blocks no
running request uses, least recently freed first (a finished request frees its blocks last one
first), and taking a cached block evicts it (vllm/v1/core/block_pool.py, 0.32). So once what the
requests ahead need passes what the engine has free, its oldest idle blocks go, and a prefix the
index shows can be gone when the request is started. The prediction counts only the leading
blocks that will still be there.

This is one gateway's view: the requests it sent, the first 128 blocks it hashed for each and
how many full blocks it did not hash (past that bound, or the rest of a chat of which only the
leading part's tokens are known: gateway/prefix_tokens.py), when the engine started each and
when it finished, and the engine's size in blocks from its metrics (`vllm:cache_config_info`).

- **Started** means the engine's allocation for it shows in the index. vLLM publishes a step's
  KV events when the step ends, just before the step's output, so a streamed request counts as
  started at its first streamed bytes, never earlier: a metrics sample showing none waiting
  comes while its step runs, before its evictions are published (at 32 blocks in the
  benchmark, that rule for streamed requests added 1.5 and 2.6 points to the mean error, of 4.9%
  and 7.4% of prompt tokens). A request not streamed shows no bytes until it is done, so it
  counts as started once a metrics sample taken after it was sent showed none waiting; that
  sample can still come before its step's events.
- **Blocks not hashed** take their places in the free queue as placeholders (negative ids: an
  engine's are unsigned), freed before the request's hashed ones, as its tail is. Those the
  index no longer holds unaccounted for were evicted, the oldest first. Counted as idle blocks
  of unknown age, they had absorbed evictions that in truth took older prefixes.
- **Sent before their token ids** (a prompt starting a prefix the gateway never sent, whose ids
  are asked aside: gateway/tokenize.py): such a request counts for nothing it will store until
  they come (`identify`), then as if sent with them; one that finished first leaves its blocks
  of unknown age.
- **Requests ahead with the same prefix:** blocks a request sent earlier to the same replica will
  store (it is not started yet) are there when this one is started: `in_flight_run`.
- Idle blocks no request of this gateway freed (another gateway's, or older than this gateway)
  count as the oldest. Without the engine's size the prediction is the index's alone.

Memory: a few ints per request in flight and one dict slot per block it hashed (a count of the
blocks in flight), and per replica one dict slot (about 80 bytes) per block a finished request
freed, placeholders included, dropped once the engine no longer holds it. The work, only while
the requests waiting ahead need more than the engine has free: one pass over those slots.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol


class HeldBlocks(Protocol):
    """The part of the KV index this reads."""

    def size(self, replica_id: str) -> int: ...

    def holds(self, replica_id: str, block: int) -> bool: ...


@dataclass(slots=True)
class _Sent:
    blocks: tuple[int, ...]  # its full blocks' ids as the gateway hashed them, in order
    unhashed: int  # its full blocks after those, not hashed
    need: int  # blocks it takes from the free queue when the engine starts it
    at: float  # when it was sent (the caller's monotonic clock)
    streamed: bool
    started: bool = False
    from_peer: bool = False  # sent by another gateway, which told this one


class PressureListener(Protocol):
    """Told what this gateway sends (gateway/peers/outbox.py), for the other gateways' records:
    each request's ticket and, once known, its blocks; when it starts and when it ends."""

    def kv_sent(
        self, replica_id: str, ticket: int, blocks: Sequence[int], unhashed: int, need: int
    ) -> None: ...

    def kv_started(self, replica_id: str, ticket: int) -> None: ...

    def kv_finished(self, replica_id: str, ticket: int) -> None: ...


class KvPressure:
    def __init__(self) -> None:
        # replica -> ticket -> a request sent there and not finished.
        self._sent: dict[str, dict[int, _Sent]] = {}
        # replica -> how many requests in flight there hashed each block.
        self._in_flight: dict[str, Counter[int]] = {}
        # replica -> blocks finished requests freed, least recently freed first; negative ids
        # stand for blocks they did not hash.
        self._freed: dict[str, dict[int, None]] = {}
        self._tickets = itertools.count()
        self._placeholders = itertools.count(-1, -1)
        # Told of this gateway's own requests; requests another gateway sent (`from_peer`) are
        # recorded the same way and told to nobody.
        self.listener: PressureListener | None = None

    def sent(
        self,
        replica_id: str,
        blocks: Sequence[int],
        need: int,
        at: float,
        *,
        full_blocks: int | None = None,
        streamed: bool = True,
        from_peer: bool = False,
    ) -> int:
        """A request was sent to the replica at `at`; its ticket for `started` and `finished`.
        `full_blocks`: its prompt's full blocks, hashed or not (at least `blocks`)."""
        ticket = next(self._tickets)
        unhashed = max((full_blocks or 0) - len(blocks), 0)
        sent = _Sent(tuple(blocks), unhashed, max(need, 0), at, streamed, from_peer=from_peer)
        self._sent.setdefault(replica_id, {})[ticket] = sent
        self._in_flight.setdefault(replica_id, Counter()).update(sent.blocks)
        if self.listener is not None and not from_peer:
            self.listener.kv_sent(replica_id, ticket, sent.blocks, unhashed, sent.need)
        return ticket

    def identify(
        self,
        replica_id: str,
        ticket: int,
        blocks: Sequence[int],
        need: int,
        *,
        full_blocks: int | None = None,
        from_peer: bool = False,
    ) -> None:
        """A request `sent` without its blocks (its token ids came later): now with them, as
        `sent` would have taken them. Nothing once it has finished: its blocks then count as
        of unknown age."""
        sent = self._sent.get(replica_id, {}).get(ticket)
        if sent is None or sent.blocks:
            return
        sent.blocks = tuple(blocks)
        sent.unhashed = max((full_blocks or 0) - len(blocks), 0)
        sent.need = max(need, 0)
        self._in_flight.setdefault(replica_id, Counter()).update(sent.blocks)
        if self.listener is not None and not from_peer:
            self.listener.kv_sent(replica_id, ticket, sent.blocks, sent.unhashed, sent.need)

    def started(self, replica_id: str, ticket: int, *, from_peer: bool = False) -> None:
        """The engine started it (its first bytes came back): its blocks are allocated."""
        sent = self._sent.get(replica_id, {}).get(ticket)
        if sent is not None:
            sent.started = True
            if self.listener is not None and not from_peer:
                self.listener.kv_started(replica_id, ticket)

    def finished(self, replica_id: str, ticket: int, *, from_peer: bool = False) -> None:
        """Done, however it ended: its blocks go to the back of the engine's free queue, its
        last block first."""
        sent = self._sent.get(replica_id, {}).pop(ticket, None)
        if sent is None:
            return
        if self.listener is not None and not from_peer:
            self.listener.kv_finished(replica_id, ticket)
        counts = self._in_flight[replica_id]
        for block in sent.blocks:
            counts[block] -= 1
            if counts[block] <= 0:
                del counts[block]
        freed = self._freed.setdefault(replica_id, {})
        for _ in range(sent.unhashed):
            freed[next(self._placeholders)] = None
        for block in reversed(sent.blocks):
            freed.pop(block, None)
            freed[block] = None

    def in_flight(self) -> list[tuple[str, int, tuple[int, ...], int, int, bool]]:
        """This gateway's own requests in flight as (replica, ticket, blocks, unhashed, need,
        started): a snapshot for another gateway (gateway/peers/)."""
        return [
            (replica_id, ticket, s.blocks, s.unhashed, s.need, s.started)
            for replica_id, sent in self._sent.items()
            for ticket, s in sent.items()
            if not s.from_peer
        ]

    def forget(self, replica_id: str) -> None:
        """Its engine's cache was reset: no block's age is known any more."""
        self._freed.pop(replica_id, None)

    def retain(self, replica_ids: Collection[str]) -> None:
        """Forget the replicas not in `replica_ids` (they left the routing table)."""
        for replica_id in [r for r in self._freed if r not in replica_ids]:
            del self._freed[replica_id]

    def in_flight_run(self, replica_id: str, blocks: Iterable[int]) -> int:
        """How many of `blocks`, from the first, requests in flight to the replica hashed: a
        request sent there earlier stores them before a request sent now is started (or holds
        them already)."""
        held = self._in_flight.get(replica_id)
        if not held:
            return 0
        run = 0
        for block in blocks:
            if not held[block]:
                break
            run += 1
        return run

    def surviving(
        self,
        replica_id: str,
        matched: Sequence[int],
        capacity: int | None,
        index: HeldBlocks,
        started_before: float | None = None,
    ) -> int:
        """How many of `matched` (a request's leading blocks the replica's engine holds, or a
        request ahead will store) its engine will still hold when it starts a request sent
        now, if its cache is `capacity` blocks. `started_before`: requests not streamed that
        were sent before then count as started (the engine's metrics, sampled then, showed
        none waiting)."""
        if capacity is None or not matched:
            return len(matched)
        sent = list(self._sent.get(replica_id, {}).values())
        if started_before is not None:
            for s in sent:
                s.started = s.started or (not s.streamed and s.at <= started_before)
        demand = sum(s.need for s in sent if not s.started)
        if demand == 0:
            return len(matched)
        held = index.size(replica_id)
        # Besides the cached blocks, each running request holds a block with no prefix yet.
        running = [s for s in sent if s.started]
        evicted = demand - max(capacity - held - len(running), 0)
        if evicted <= 0:
            return len(matched)
        in_use = self._in_flight.get(replica_id, Counter())
        freed = self._freed.get(replica_id, {})
        for block in [b for b in freed if b >= 0 and not index.holds(replica_id, b)]:
            del freed[block]
        held_in_use = sum(index.holds(replica_id, b) for b in in_use)
        idle_hashed = [b for b in freed if b >= 0 and not in_use[b]]
        # Held blocks neither hashed by a request in flight nor freed by one with its hash:
        # running requests' unhashed blocks, then finished ones' (placeholders), then blocks
        # of unknown age.
        untracked = held - held_in_use - len(idle_hashed) - sum(s.unhashed for s in running)
        untracked = max(untracked, 0)
        placeholders = [b for b in freed if b < 0]
        for block in placeholders[: max(len(placeholders) - untracked, 0)]:
            del freed[block]  # evicted: the engine evicts its oldest idle blocks first
        unknown_age = untracked - min(len(placeholders), untracked)
        if evicted < unknown_age:
            # Blocks of unknown age absorb it all; which of them go cannot be told.
            return len(matched)
        idle = [b for b in freed if b < 0 or not in_use[b]]
        doomed = set(idle[: evicted - unknown_age])
        for position, block in enumerate(matched):
            if block in doomed or (not in_use[block] and block not in freed):
                return position  # evicted, or of unknown age with every such block gone
        return len(matched)
