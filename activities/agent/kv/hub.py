"""What this node's replicas hold in their prefix caches, and every change to it fanned out to
the gateways reading the agent's KV feed (kv/feed.py; served by kv/feed_server.py).

The replicas' KvSubscribers (kv/subscriptions.py) hand the hub their events in the engine's
order. Each change becomes feed deltas, each taking the next sequence number, pushed onto the
bounded queue of every attached reader. A reader's first messages are a snapshot of the whole
index, taken in the same synchronous step that registers its queue: everything here runs on the
agent's one event loop, so no delta falls between the snapshot and the queue, nor lands in both.

The index is bounded (KvBlockIndex, max_blocks per replica, the oldest stored dropped first). A
gateway keeps a KvBlockIndex with the same bound and applies the same stored blocks in the same
order (the snapshot oldest first, then the deltas), so both drop the same blocks: the hub applies
a BlockStored of more than MAX_BLOCKS_PER_LINE ids chunk by chunk, exactly as the gateway
receives it, rather than in one piece.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import deque
from dataclasses import asdict, dataclass

from kv.events import AllBlocksCleared, BlockRemoved, BlockStored, Event
from kv.feed import (
    FeedLive,
    FeedMessage,
    FeedRemoved,
    FeedReset,
    FeedSnapshot,
    FeedStored,
    chunks,
)
from kv.index import DEFAULT_MAX_BLOCKS, KvBlockIndex
from kv.subscriber import KvSubscriber

# What one reader may have waiting, counted as block ids plus one per message: about 8 MB of
# list slots (the ids themselves are mostly shared with the index). A gateway that reads this
# far behind is disconnected and reconnects for a snapshot, which costs less than holding an
# unbounded backlog for it.
MAX_PENDING = 1_000_000


class FeedEnded(Exception):
    """The reader was ended (it fell too far behind, or the feed is stopping): its connection
    is to be closed."""


class FeedReader:
    """One feed connection's messages: the snapshot it was attached with, then the deltas."""

    def __init__(self, snapshot: list[FeedMessage], max_pending: int) -> None:
        self._snapshot = deque(snapshot)
        self._pending: deque[FeedMessage] = deque()
        self._held = 0
        self._max_pending = max_pending
        self._ready = asyncio.Event()
        # Set when the connection is to be closed: overflowed, or the server is stopping.
        self.ended = asyncio.Event()
        # It fell more than max_pending behind: the gateway reconnects for a new snapshot.
        self.overflowed = False
        # The seq of the last message taken: what a ping repeats while the feed is quiet.
        self.last_seq = snapshot[0].seq if snapshot else 0
        if snapshot:
            self._ready.set()

    def push(self, message: FeedMessage) -> None:
        if self.ended.is_set():
            return
        weight = _weight(message)
        if self._held + weight > self._max_pending:
            self.overflowed = True
            self.end()
            return
        self._pending.append(message)
        self._held += weight
        self._ready.set()

    def end(self) -> None:
        """Send nothing more: what waits is dropped, and the connection is to be closed."""
        self._snapshot.clear()
        self._pending.clear()
        self._held = 0
        self.ended.set()
        self._ready.set()

    def take(self, most: int) -> list[FeedMessage]:
        """Up to `most` messages ready now, the snapshot's first; [] when none is. Raises
        FeedEnded once the reader has been ended."""
        if self.ended.is_set():
            raise FeedEnded
        taken: list[FeedMessage] = []
        while self._snapshot and len(taken) < most:
            taken.append(self._snapshot.popleft())
        while self._pending and len(taken) < most:
            message = self._pending.popleft()
            self._held -= _weight(message)
            taken.append(message)
        if not self._snapshot and not self._pending:
            self._ready.clear()
        if taken:
            self.last_seq = taken[-1].seq
        return taken

    async def wait(self, timeout_s: float) -> bool:
        """Whether a message arrived (or the reader was ended) within `timeout_s`."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._ready.wait()
        except TimeoutError:
            return False
        return True


def _weight(message: FeedMessage) -> int:
    return 1 + (len(message.blocks) if isinstance(message, FeedStored | FeedRemoved) else 0)


@dataclass
class _Source:
    """Where a replica's events come from, for the status endpoint."""

    endpoint: str
    subscriber: KvSubscriber | None = None  # None while its socket could not be bound
    bind_failures: int = 0
    error: str = ""


class KvHub:
    """A KvSink (kv/subscriber.py) holding this node's replicas' blocks for the KV feed."""

    def __init__(
        self, max_blocks: int = DEFAULT_MAX_BLOCKS, max_pending: int = MAX_PENDING
    ) -> None:
        # New with every agent process: a gateway's seq numbers count within one epoch.
        self.epoch = secrets.token_hex(8)
        # The seq of the last delta; a snapshot taken now carries it.
        self.seq = 0
        self._index = KvBlockIndex(max_blocks)
        self._max_pending = max_pending
        self._readers: set[FeedReader] = set()
        self._sources: dict[str, _Source] = {}

    # --- the KvSink side -----------------------------------------------------------------

    def apply(self, replica_id: str, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, BlockStored):
                if event.block_ids:
                    for piece in chunks(event.block_ids):
                        # Applied as the gateway will receive it: one line at a time.
                        self._index.apply(replica_id, BlockStored(piece, None, [], 1))
                        self._emit(FeedStored(self._next(), replica_id, piece))
            elif isinstance(event, BlockRemoved):
                if event.block_ids:
                    self._index.apply(replica_id, event)
                    for piece in chunks(event.block_ids):
                        self._emit(FeedRemoved(self._next(), replica_id, piece))
            elif isinstance(event, AllBlocksCleared):
                self.reset(replica_id)
            else:
                # An UnknownEvent: the subscriber resets instead of handing one on, but what
                # the replica holds is unknown either way.
                self.reset(replica_id)

    def reset(self, replica_id: str) -> None:
        self._index.reset(replica_id)
        self._emit(FeedReset(self._next(), replica_id))

    def blocks(self, replica_id: str) -> list[int]:
        """The replica's block ids, oldest stored first."""
        return self._index.blocks(replica_id)

    # --- readers -------------------------------------------------------------------------

    def attach(self) -> FeedReader:
        """A new reader: the snapshot now, then every delta after it."""
        replicas = sorted(set(self._sources) | set(self._index.replicas()))
        snapshot: list[FeedMessage] = [FeedSnapshot(self.epoch, self.seq, replicas)]
        for replica_id in replicas:
            # Oldest first, so a bounded index fed them drops the same ones this one does.
            for piece in chunks(self._index.blocks(replica_id)):
                snapshot.append(FeedStored(self.seq, replica_id, piece))
        snapshot.append(FeedLive(self.seq))
        reader = FeedReader(snapshot, self._max_pending)
        self._readers.add(reader)
        return reader

    def detach(self, reader: FeedReader) -> None:
        self._readers.discard(reader)

    def end_readers(self) -> None:
        """End every reader: the feed is stopping."""
        for reader in self._readers:
            reader.end()

    @property
    def readers(self) -> int:
        return len(self._readers)

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def _emit(self, message: FeedMessage) -> None:
        for reader in self._readers:
            reader.push(message)

    # --- sources, for the status endpoint ------------------------------------------------

    def watch(self, replica_id: str, endpoint: str, subscriber: KvSubscriber) -> None:
        """The replica's subscriber is listening on `endpoint`."""
        source = self._sources.setdefault(replica_id, _Source(endpoint))
        source.endpoint, source.subscriber, source.error = endpoint, subscriber, ""

    def bind_failed(self, replica_id: str, endpoint: str, error: str) -> None:
        source = self._sources.setdefault(replica_id, _Source(endpoint))
        source.endpoint, source.subscriber, source.error = endpoint, None, error
        source.bind_failures += 1

    def forget(self, replica_id: str) -> None:
        """The replica no longer runs here: its blocks go, and gateways are told."""
        self._sources.pop(replica_id, None)
        self.reset(replica_id)

    def sources(self) -> list[str]:
        return list(self._sources)

    def status(self) -> dict[str, object]:
        replicas: dict[str, object] = {}
        for replica_id in sorted(set(self._sources) | set(self._index.replicas())):
            source = self._sources.get(replica_id)
            subscriber = source.subscriber if source else None
            replicas[replica_id] = {
                "blocks": self._index.size(replica_id),
                "endpoint": source.endpoint if source else None,
                "subscribed": subscriber is not None,
                "bind_failures": source.bind_failures if source else 0,
                "error": source.error if source else "",
                "engine_seq": subscriber.last_seq if subscriber else None,
                "counters": asdict(subscriber.counters) if subscriber else None,
            }
        return {"epoch": self.epoch, "seq": self.seq, "readers": self.readers, "replicas": replicas}
