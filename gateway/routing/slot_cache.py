"""What a llama-server replica whose prompt cache is its slots alone will find for a request,
replayed from the requests this gateway sent it.

llama-server gives a request the idle slot whose last prompt shares the largest part of the
request's prompt, when that part exceeds its `--slot-prompt-similarity` (0.1); else the least
recently used idle slot; with none idle, the request waits and takes a slot as one frees
(tools/server's get_available_slot). Started with `--cache-ram 0`, it keeps no other copy: a
prompt lives only in the slot that last ran it, and the slot's next prompt replaces it. So
with more prompt prefixes than slots, where a request goes decides which prefix is lost. A
request of a prefix whose only slot is busy (two of its requests overlap) takes another idle
slot, misses wherever it goes, and on a replica whose other slot holds a second prefix it
evicts that one, while on a replica with a slot to spare it evicts nothing.

The gateway replays the engine's choice on what it sent each such replica (`Route.prompt_slots`
says which: a replica's route takes it from its profile's flags, Profile.prompt_slots), each
prompt as the prefix index's 256-byte block hashes (prefix_index.py), parts counted in blocks
rather than tokens. The other gateway processes on the store tell this one what they send
such replicas, and their requests are replayed with this gateway's (gateway/peers/): behind two
gateways, replaying only its own requests halved the cached share in `make bench-routing`'s
small setting (docs/benchmarks-history.md, Routing quality, 2026-12-06: behind two gateways).
Clients sending to the engine directly are not seen, and requests of two gateways sent within
the bus's flush (10 ms) may be replayed in another order than the engine took them.

Pure and bounded: a replica's slots and the requests waiting for them (no more than the gateway
has in flight there: max_inflight_per_replica), each a list of at most MAX_BLOCKS hashes.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gateway.prefix_tokens import common_start

# llama-server's default --slot-prompt-similarity.
DEFAULT_SIMILARITY = 0.1


@dataclass(frozen=True, slots=True)
class SlotView:
    """What a request sent now would meet on a replica."""

    found: int  # leading blocks of its prompt in the slot it would be given
    evicts: bool  # that slot holds a prompt no other slot of the replica shares a block with
    waits: bool  # no slot is idle: it would wait, then take the slot likeliest to free first


@dataclass(slots=True)
class _Slot:
    keys: Sequence[int] = ()  # block hashes of the prompt it ran last
    ticket: int | None = None  # the request running there
    used: int = -1  # when it was last given a request (a counter)


@dataclass
class SlotReplay:
    """One replica's slots, as its engine assigns them."""

    slots: int
    similarity: float = DEFAULT_SIMILARITY
    _slots: list[_Slot] = field(init=False)
    _waiting: deque[tuple[int, Sequence[int]]] = field(init=False, default_factory=deque)
    _clock: itertools.count[int] = field(init=False, default_factory=itertools.count)

    def __post_init__(self) -> None:
        self._slots = [_Slot() for _ in range(max(1, self.slots))]

    def view(self, keys: Sequence[int]) -> SlotView:
        slot = self._pick(keys)
        waits = slot is None
        if slot is None:
            # It will take a slot as one frees: requests of similar length free them in the
            # order they took them, and those already waiting go first.
            busy = sorted(self._slots, key=lambda s: s.used)
            slot = busy[len(self._waiting) % len(busy)]
        found = common_start(slot.keys, keys)
        lost = bool(slot.keys) and found == 0 and self._unique(slot)
        return SlotView(found, lost, waits)

    def start(self, ticket: int, keys: Sequence[int]) -> None:
        """A request sent: it takes the slot the engine would give it, or waits for one."""
        if self._waiting or not self._take(ticket, keys):
            self._waiting.append((ticket, keys))

    def finish(self, ticket: int) -> None:
        """A request ended (answered, failed or cancelled): its slot frees, keeping its prompt,
        and the requests waiting take slots in the order they came."""
        for slot in self._slots:
            if slot.ticket == ticket:
                slot.ticket = None
                break
        else:
            self._waiting = deque(w for w in self._waiting if w[0] != ticket)
            return
        while self._waiting and self._take(*self._waiting[0]):
            self._waiting.popleft()

    def _take(self, ticket: int, keys: Sequence[int]) -> bool:
        slot = self._pick(keys)
        if slot is None:
            return False
        slot.keys, slot.ticket, slot.used = keys, ticket, next(self._clock)
        return True

    def _pick(self, keys: Sequence[int]) -> _Slot | None:
        """The idle slot the engine would give a prompt of `keys`: the one sharing the largest
        part of it, above the similarity threshold; else the least recently used."""
        idle = [s for s in self._slots if s.ticket is None]
        if not idle:
            return None
        if keys and self.similarity > 0:
            best, part = None, self.similarity
            for slot in idle:
                share = common_start(slot.keys, keys) / len(keys)
                if share > part:
                    best, part = slot, share
            if best is not None:
                return best
        return min(idle, key=lambda s: s.used)

    def _unique(self, slot: _Slot) -> bool:
        others = (other for other in self._slots if other is not slot)
        return not any(common_start(other.keys, slot.keys) for other in others)


class SlotListener(Protocol):
    """Told what this gateway sends such replicas (gateway/peers/outbox.py)."""

    def slot_sent(self, replica_id: str, ticket: int, slots: int, keys: Sequence[int]) -> None: ...

    def slot_finished(self, replica_id: str, ticket: int) -> None: ...


class SlotBoard:
    """The replays of every replica whose prompt cache is its slots, with the tickets of the
    requests sent there."""

    def __init__(self) -> None:
        self._replicas: dict[str, SlotReplay] = {}
        self._tickets = itertools.count()
        # Told of this gateway's own requests; another gateway's (`from_peer`) are replayed
        # the same way and told to nobody.
        self.listener: SlotListener | None = None

    def view(self, replica_id: str, slots: int, keys: Sequence[int]) -> SlotView:
        return self._replay(replica_id, slots).view(keys)

    def sent(
        self, replica_id: str, slots: int, keys: Sequence[int], *, from_peer: bool = False
    ) -> int:
        ticket = next(self._tickets)
        self._replay(replica_id, slots).start(ticket, keys)
        if self.listener is not None and not from_peer:
            self.listener.slot_sent(replica_id, ticket, slots, keys)
        return ticket

    def finished(self, replica_id: str, ticket: int, *, from_peer: bool = False) -> None:
        replay = self._replicas.get(replica_id)
        if replay is not None:
            replay.finish(ticket)
        if self.listener is not None and not from_peer:
            self.listener.slot_finished(replica_id, ticket)

    def retain(self, replica_ids: Collection[str]) -> None:
        """Forget replicas not in `replica_ids`: one that left or restarted lost its slots."""
        for replica_id in [r for r in self._replicas if r not in replica_ids]:
            del self._replicas[replica_id]

    def _replay(self, replica_id: str, slots: int) -> SlotReplay:
        replay = self._replicas.get(replica_id)
        if replay is None or replay.slots != slots:
            replay = self._replicas[replica_id] = SlotReplay(slots)
        return replay
