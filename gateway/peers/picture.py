"""What the other gateways told this one, applied to its router: the one picture of the fleet
every gateway routes by (gateway/peers/bus.py carries the messages).

From each peer (another gateway process on the same store):
- the prefixes it sent where (`p`): into this router's prefix index and working sets, as if this
  gateway had sent them (Router.learn_prefix);
- its requests to replicas whose engines publish KV events (`ks`, `kt`, `kf`: sent with their
  blocks, started, finished): into this router's eviction record (kv_pressure.py) under tickets
  of its own, so a prediction here counts what the others' requests will store and evict;
- its requests to llama.cpp replicas whose cache is their slots (`ss`, `sf`: sent with their
  prompt's block keys, finished): into this router's slot replay (slot_cache.py);
- its breaker changes (`b`): a replica it ejected is ejected here for the same period, one it
  readmitted is readmitted;
- its requests in flight per replica (`l`, the whole map, at least every HEARTBEAT_S): what the
  router adds to its own count (loads.py `EngineLoadBoard.peers`).

A peer counts as heard while its last batch is under STALE_S old and nothing was lost since its
snapshot (a sequence gap). Until every known peer is heard, `complete` is False: the router then
reads other gateways' loads from the engines' gauges again, and routing says it is degraded.
A peer that falls silent or leaves has its requests in flight finished here (its loads dropped);
what it sent where stays: the engines still hold it.

No I/O (the two snapshot steps only let the event loop run between their parts); times are the
caller's monotonic clock.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from gateway.routing import Router
from gateway.routing.prefix_index import Claims

HEARTBEAT_S = 1.0
STALE_S = 3 * HEARTBEAT_S
# Claims read or learnt between two turns of the event loop: about 20 ms of work here.
STEP_CLAIMS = 10_000

Item = list[Any]


class BadMessage(ValueError):
    """A batch or snapshot that does not have the shape this version writes."""


@dataclass
class _Peer:
    heard_at: float
    seq: int = -1  # the last batch's sequence number applied
    synced: bool = False  # its snapshot was applied and no batch was lost since
    loads: dict[str, int] = field(default_factory=dict)
    # its ticket -> (replica, this gateway's ticket for it in the eviction record)
    tickets: dict[int, tuple[str, int]] = field(default_factory=dict)
    # its ticket -> (replica, this gateway's ticket for it in the slot replay)
    slots: dict[int, tuple[str, int]] = field(default_factory=dict)
    # batches that came while its snapshot was awaited: (seq, items)
    waiting: list[tuple[int, list[Item]]] = field(default_factory=list)


class SharedPicture:
    def __init__(self, router: Router) -> None:
        self.router = router
        self._peers: dict[str, _Peer] = {}
        self.applied = 0  # items applied
        self.gaps = 0  # batches found missing (each asks for a new snapshot)
        self.malformed = 0  # items or snapshots not understood

    # -- what the router reads

    def others(self, replica_id: str) -> int | None:
        """The requests the other gateways have in flight at the replica, while every one of
        them is heard; None with no peer, or one not heard (the engine's gauges are read
        instead)."""
        if not self._peers or not self.complete:
            return None
        return sum(peer.loads.get(replica_id, 0) for peer in self._peers.values())

    @property
    def complete(self) -> bool:
        return all(peer.synced for peer in self._peers.values())

    def peers(self) -> dict[str, bool]:
        """Each known peer and whether it is heard now."""
        return {name: peer.synced for name, peer in self._peers.items()}

    # -- peers coming and going

    def met(self, name: str, now: float) -> None:
        """A peer found in the store: not heard until its snapshot is applied."""
        if name not in self._peers:
            self._peers[name] = _Peer(heard_at=now)

    def left(self, name: str) -> None:
        """The peer left the store (or was silent too long): its requests in flight end here."""
        peer = self._peers.pop(name, None)
        if peer is not None:
            self._end_requests(peer)

    def expire(self, now: float) -> list[str]:
        """Peers silent for STALE_S lose their requests in flight and wait for a new snapshot;
        returns them (the bus asks each for one)."""
        silent = []
        for name, peer in self._peers.items():
            if peer.synced and now - peer.heard_at > STALE_S:
                self._end_requests(peer)
                peer.synced = False
                silent.append(name)
        return silent

    # -- what peers send

    def batch(self, name: str, seq: int, items: list[Item], now: float) -> bool:
        """A peer's batch; False when one was lost before it (the caller asks for a snapshot)."""
        peer = self._peers.get(name)
        if peer is None:
            peer = self._peers[name] = _Peer(heard_at=now)
        peer.heard_at = now
        if not peer.synced:
            peer.waiting.append((seq, items))
            return True
        if seq != peer.seq + 1:
            self._lost(peer)
            peer.waiting.append((seq, items))
            return False
        peer.seq = seq
        self._apply(peer, items, now)
        return True

    async def snapshot_of(self, name: str, snapshot: dict[str, Any], now: float) -> bool:
        """A peer's snapshot: its own requests in flight and loads, its breakers, and (when
        asked for) its prefix index and working sets, learnt STEP_CLAIMS at a time with the
        event loop let run between (a full index takes a few hundred milliseconds). The batches
        that came meanwhile are applied after it. False when a batch was lost between them."""
        peer = self._peers.get(name)
        if peer is None:
            peer = self._peers[name] = _Peer(heard_at=now)
        peer.synced = False  # batches wait until this is done
        router = self.router
        try:
            seq = int(snapshot["seq"])
            if "index" in snapshot:
                working = [(str(r), int(k), float(a), int(b)) for r, k, a, b in snapshot["working"]]
                for part in Claims.decode(snapshot["index"]).parts(STEP_CLAIMS):
                    router.learn_claims(part, now)
                    await asyncio.sleep(0)
                router.working_sets.learn(working, now)
            self._end_requests(peer)
            for replica_id, ticket, blocks, unhashed, need, started in snapshot["tickets"]:
                self._sent(peer, [replica_id, ticket, blocks, unhashed, need], now)
                if started:
                    self._started(peer, [str(replica_id), int(ticket)])
            for replica_id, open_for_s in snapshot["breakers"]:
                router.breaker.eject(str(replica_id), float(open_for_s), now)
            peer.loads = {str(r): int(n) for r, n in snapshot["loads"].items()}
        except (KeyError, TypeError, ValueError) as exc:
            self.malformed += 1
            raise BadMessage(f"snapshot from {name}: {exc}") from exc
        peer.seq, peer.synced, peer.heard_at = seq, True, now
        waiting, peer.waiting = peer.waiting, []
        for later, items in sorted(waiting, key=lambda w: w[0]):
            if later <= seq:
                continue
            if later != peer.seq + 1:
                self._lost(peer)
                return False
            peer.seq = later
            self._apply(peer, items, now)
        return True

    # -- applying

    def _apply(self, peer: _Peer, items: list[Item], now: float) -> None:
        for item in items:
            try:
                kind, body = item[0], item[1:]
                if kind == "p":
                    self.router.learn_prefix(str(body[0]), [int(k) for k in body[1]], now)
                elif kind == "ks":
                    self._sent(peer, body, now)
                elif kind == "kt":
                    self._started(peer, body)
                elif kind == "kf":
                    self._finished(peer, body)
                elif kind == "ss":
                    replica_id, ticket, slots, keys = body
                    mine = self.router.slots.sent(
                        str(replica_id), int(slots), [int(k) for k in keys], from_peer=True
                    )
                    peer.slots[int(ticket)] = (str(replica_id), mine)
                elif kind == "sf":
                    known = peer.slots.pop(int(body[1]), None)
                    if known is not None:
                        self.router.slots.finished(*known, from_peer=True)
                elif kind == "b":
                    self._breaker(str(body[0]), float(body[1]), now)
                elif kind == "l":
                    peer.loads = {str(r): int(n) for r, n in body[0].items()}
                else:
                    self.malformed += 1
                    continue
            except (IndexError, KeyError, TypeError, ValueError, AttributeError):
                self.malformed += 1
                continue
            self.applied += 1

    def _sent(self, peer: _Peer, body: list[Any], now: float) -> None:
        replica_id, ticket, blocks, unhashed, need = body
        pressure = self.router.kv.pressure
        known = peer.tickets.get(int(ticket))
        if known is not None:
            # Sent without its blocks first, told again once its token ids came.
            pressure.identify(
                known[0],
                known[1],
                [int(b) for b in blocks],
                int(need),
                full_blocks=len(blocks) + int(unhashed),
                from_peer=True,
            )
            return
        mine = pressure.sent(
            str(replica_id),
            [int(b) for b in blocks],
            int(need),
            now,
            full_blocks=len(blocks) + int(unhashed),
            from_peer=True,
        )
        peer.tickets[int(ticket)] = (str(replica_id), mine)

    def _started(self, peer: _Peer, body: list[Any]) -> None:
        known = peer.tickets.get(int(body[1]))
        if known is not None:
            self.router.kv.pressure.started(known[0], known[1], from_peer=True)

    def _finished(self, peer: _Peer, body: list[Any]) -> None:
        known = peer.tickets.pop(int(body[1]), None)
        if known is not None:
            self.router.kv.pressure.finished(known[0], known[1], from_peer=True)

    def _breaker(self, replica_id: str, open_for_s: float, now: float) -> None:
        if open_for_s > 0:
            self.router.breaker.eject(replica_id, open_for_s, now)
        else:
            self.router.breaker.readmit(replica_id)

    def _lost(self, peer: _Peer) -> None:
        self.gaps += 1
        peer.synced = False
        self._end_requests(peer)

    def _end_requests(self, peer: _Peer) -> None:
        pressure = self.router.kv.pressure
        for replica_id, mine in peer.tickets.values():
            pressure.finished(replica_id, mine, from_peer=True)
        peer.tickets.clear()
        for replica_id, mine in peer.slots.values():
            self.router.slots.finished(replica_id, mine, from_peer=True)
        peer.slots.clear()
        peer.loads = {}


async def snapshot(
    router: Router, seq: int, loads: dict[str, int], now: float, *, index: bool
) -> dict[str, Any]:
    """This gateway's part of the picture for a peer that asks: its own requests in flight and
    loads, the breakers open here, and with `index` everything it knows of what was sent where
    (its own and what peers told it: one peer's snapshot then brings a new gateway all of it),
    read in steps with the event loop let run between. `seq`: the last batch published before
    it; its requests in flight are read before the first step, so they are those of `seq`."""
    found: dict[str, Any] = {
        "seq": seq,
        "tickets": [list(t) for t in router.kv.pressure.in_flight()],
        "breakers": router.breaker.open_now(now),
        "loads": loads,
    }
    if index:
        for claims in router.index.claims_stepwise(now, STEP_CLAIMS):
            if claims is None:
                await asyncio.sleep(0)
            else:
                found["index"] = claims.encode()
        found["working"] = router.working_sets.entries(now)
    return found
