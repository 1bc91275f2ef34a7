"""Placement against the fleet tables, decided in memory and committed in one transaction.

The control worker keeps every node's record and every allocation in memory, with the
PlacementIndex that makes a placement at 10,000 nodes a matter of microseconds to decide. A
decision is then committed in one transaction (store/fleet/tables.py: commit_placement) that
holds only if every node it chose is still at the rev it was decided on, and that claims each
port and GPU in rows no two allocations can share. So the memory may be stale (another control
worker placed or released meanwhile, a node changed) and nothing is ever double-booked: a
decision made on a stale node fails, the node is read again, and the replica is placed anew.

Between two placements nothing awaits: a decision and its reservation in memory happen in one
step, so the placements in flight in this process see each other's reservations. Each commits
where the node is at the rev this placer read, or was last written by this placer: its own
commits may land in any order, and none of them is news to its memory.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import secrets
import time
from collections import Counter
from collections.abc import Iterable

from store.fleet import Conflict, FleetTables
from store.fleet.tables import NodeLoad
from workflows.contracts import (
    Allocation,
    LedgerState,
    NodeRecord,
    PlacementRefusal,
    PlacementRefused,
    PlacementRequest,
)
from workflows.placement import PlacementIndex, place
from workflows.placement.refusal import summarise_refusal

log = logging.getLogger(__name__)

# How often the memory is compared with the tables' revs (one read of every node's name and
# rev), to learn what other control workers and node updates changed.
RESYNC_S = 2.0
# A placement whose commit keeps meeting changed nodes is decided again this many times, after
# a random pause each time, of up to BACKOFF_S doubled with every try up to MAX_BACKOFF_S (so
# placers contending for a few nodes spread out instead of colliding again in step).
MAX_TRIES = 30
BACKOFF_S = 0.005
MAX_BACKOFF_S = 0.25
# How long a node where another placer's change refused a commit is tried last.
CONTENDED_S = 2.0


class Placer:
    def __init__(self, tables: FleetTables, resync_s: float = RESYNC_S) -> None:
        self.tables = tables
        self._resync_s = resync_s
        self._state = LedgerState()
        self._index: PlacementIndex | None = None
        self._revs: dict[str, int] = {}
        self._synced_at = 0.0
        # Nodes to read again before the next decision, and the reservations in flight on each
        # (a node is read again only when none is: reading it would drop them).
        self._stale: set[str] = set()
        self._pending: Counter[str] = Counter()
        # Written beside each node this placer changes: a node it wrote last is one its memory
        # holds whole, whatever order its commits reached the tables in.
        self.id = secrets.token_hex(8)
        # Node -> time.monotonic() until which it is tried last (see place).
        self._contended: dict[str, float] = {}
        self._loading = asyncio.Lock()
        # Commits that met a node changed since the decision, and were decided again.
        self.redecided = 0

    async def place(self, req: PlacementRequest) -> Allocation | PlacementRefusal:
        """Place one replica; idempotent per replica id (a retry gets the allocation it has)."""
        index = await self._ready()
        if req.replica_id in self._state.allocations:
            # A retried call, or memory that another control worker's release made stale:
            # the tables say which.
            held = await self.tables.allocation(req.replica_id)
            if held is not None:
                return held
            self._drop(req.replica_id)
        fresh = False
        # Nodes whose commit met another placer's change, lately or for this replica: tried
        # last, so two placers bin-packing the same fleet fill different nodes instead of both
        # the tightest one, one of them failing every time.
        now = time.monotonic()
        self._contended = {n: t for n, t in self._contended.items() if t > now}
        avoid = set(self._contended)
        for attempt in range(MAX_TRIES):
            pause = random.random() * min(BACKOFF_S * 2**attempt, MAX_BACKOFF_S)
            # A node whose rev here is known wrong (a commit on it failed) and that cannot be
            # read again yet (reservations in flight on it) is passed over until it can.
            unsure = {n for n in self._stale if self._pending[n]}
            asked = req
            if avoid or unsure:
                skip = [*req.exclude_nodes, *sorted(avoid | unsure)]
                asked = req.model_copy(update={"exclude_nodes": skip})
            decision = place(self._state, asked, self._index or index)
            if isinstance(decision, PlacementRefused):
                if avoid or unsure:
                    # The nodes passed over are the only ones left: wait for them.
                    avoid.clear()
                    await asyncio.sleep(pause)
                    await self._sync()
                    continue
                if not fresh:
                    # What refused may be stale: look again once at what the tables hold now.
                    await self._sync(force=True)
                    fresh = True
                    continue
                summary = summarise_refusal(decision.reasons)
                return PlacementRefusal(replica_id=req.replica_id, summary=summary)
            placed = await self._commit(decision)
            if placed is not None:
                return placed
            avoid.update(_nodes(decision))
            self._order_own()
            until = time.monotonic() + CONTENDED_S
            self._contended.update((n, until) for n in _nodes(decision))
            # Another placer is working on the same nodes: catch up with all it changed, not
            # only the node that refused, and let it get ahead a little.
            await asyncio.sleep(pause)
            await self._sync(force=True)
        raise Conflict(f"{req.replica_id}: nodes kept changing under {MAX_TRIES} placements")

    async def _commit(self, alloc: Allocation) -> Allocation | None:
        """Reserve in memory, then commit; the allocation, or None when it must be decided
        again (a node changed). A replica that holds an allocation already gets that one."""
        nodes = _nodes(alloc)
        revs = {node: self._revs.get(node, 0) for node in nodes}
        self._add(alloc)
        for node in nodes:
            self._pending[node] += 1
        try:
            await self.tables.commit_placement(alloc, revs, self.id)
        except Conflict:
            self.redecided += 1
            self._drop(alloc.replica_id)
            self._stale.update(nodes)
            held = await self.tables.allocation(alloc.replica_id)
            if held is not None:
                self._add(held)
                self._stale.update(_nodes(held))
                return held
            return None
        except BaseException:
            # Not known whether it committed: read the nodes again before deciding on them.
            self._drop(alloc.replica_id)
            self._stale.update(nodes)
            raise
        finally:
            for node in nodes:
                self._pending[node] -= 1
        if alloc.replica_id not in self._state.allocations:
            self._add(alloc)  # a read of one of its nodes dropped it meanwhile
        return alloc

    async def released(self, replica_id: str) -> None:
        """The tables freed a replica's allocation."""
        alloc = self._drop(replica_id)
        if alloc is not None:
            self._stale.update(_nodes(alloc))

    def node_written(self, name: str) -> None:
        """The tables took a new record for the node: read it before placing on it."""
        self._stale.add(name)

    async def _ready(self) -> PlacementIndex:
        if self._index is None:
            async with self._loading:  # the placements in flight at start read once
                if self._index is None:
                    await self._load_all()
        else:
            await self._sync()
        assert self._index is not None
        return self._index

    async def _load_all(self) -> None:
        started = time.monotonic()
        nodes = await self.tables.node_rows()
        allocations = await self.tables.allocations()
        self._state = LedgerState(
            nodes={name: row.record for name, row in nodes.items()}, allocations=allocations
        )
        self._revs = {name: row.rev for name, row in nodes.items()}
        self._index = PlacementIndex(self._state, tiebreak=_by_name)
        self._stale.clear()
        self._synced_at = time.monotonic()
        log.info(
            "placement read %d nodes and %d allocations in %.2f s",
            len(nodes),
            len(allocations),
            self._synced_at - started,
        )

    async def _sync(self, force: bool = False) -> None:
        """Read again the nodes marked stale and, every RESYNC_S (or when forced), every node
        whose rev in the tables is not the one held here."""
        names = set(self._stale)
        if force or time.monotonic() - self._synced_at >= self._resync_s:
            self._synced_at = time.monotonic()
            held = await self.tables.node_revs()
            names |= {
                name
                for name in held.keys() | self._revs.keys()
                # What this placer wrote last is in its memory already.
                if name not in held
                or (held[name][0] != self._revs.get(name) and held[name][1] != self.id)
            }
        names = {n for n in names if not self._pending[n]}
        if names:
            self._stale -= names
            self._apply(await self.tables.load_nodes(sorted(names)))

    def _apply(self, loads: Iterable[NodeLoad]) -> None:
        assert self._index is not None
        for load in loads:
            if self._pending[load.name]:
                # A reservation was made on it while it was being read: what was read does
                # not hold it. Read it again once none is in flight.
                self._stale.add(load.name)
                continue
            for replica_id in self._index.replicas_on(load.name):
                self._drop(replica_id)
            if load.row is None:
                self._state.nodes.pop(load.name, None)
                self._revs.pop(load.name, None)
            else:
                self._state.nodes[load.name] = load.row.record
                self._revs[load.name] = load.row.rev
            self._index.node_changed(load.name)
            for alloc in load.allocations:
                self._drop(alloc.replica_id)
                self._add(alloc)

    def _order_own(self) -> None:
        """From the first commit another placer's change refused on: nodes placement likes
        equally are ordered by a hash of this placer's id and their name rather than by name,
        so racing placers pack different nodes instead of each the one the other just packed.
        (One placer alone keeps the plain order, by name.)"""
        if self._index is None or self._index.tiebreak is not _by_name:
            return
        salt = self.id.encode()

        def own_order(name: str) -> str:
            return hashlib.blake2b(name.encode(), key=salt, digest_size=8).hexdigest()

        self._index = PlacementIndex(self._state, tiebreak=own_order)

    def _add(self, alloc: Allocation) -> None:
        assert self._index is not None
        self._state.allocations[alloc.replica_id] = alloc
        self._index.add(alloc)

    def _drop(self, replica_id: str) -> Allocation | None:
        alloc = self._state.allocations.pop(replica_id, None)
        if alloc is not None and self._index is not None:
            self._index.remove(alloc)
        return alloc

    def nodes(self) -> dict[str, NodeRecord]:
        return self._state.nodes


def _nodes(alloc: Allocation) -> list[str]:
    return sorted({s.node for s in alloc.shards_or_leader()})


def _by_name(name: str) -> str:
    return name
