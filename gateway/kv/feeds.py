"""Reading the node agents' KV feeds into the gateway's KvBlockIndex: which prefix-cache blocks
each vLLM replica's engine holds, for the router's "kv_prefix" choice
(gateway/routing/prefix_choice.py).

One `KvFeedReader` per agent feed (kv/feed.py): it reads the feed's newline-delimited
JSON, a snapshot then deltas, into the index shared by the whole gateway. Anything it cannot
trust (a sequence gap, a malformed line, a refused token, a dropped connection, no line for
three ping intervals) makes it forget every replica that feed told it about (a replica scored
from a half-read feed could pull requests to blocks it no longer holds; one scored 0 only loses
a hit) and reconnect for a new snapshot, after 0.2 s doubling to 5 s while it keeps failing
(each wait drawn between half and all of that, so gateways that lost an agent together do not
all come back at once). Nothing is raised out of a reader; everything is counted
(`FeedCounters`: shown at /metrics and GET /admin/v1/kv).

`KvFeeds` keeps one reader per distinct (feed, node) among READY routes whose `kv` names a feed
(an external engine's names its publisher: gateway/kv/publishers.py): `retain` on
each new routing table starts the new ones and stops the gone ones. A reader takes blocks only
for replicas the table does not give to another node (an agent speaks for its own replicas),
and replicas that are not READY are dropped from the index (a replica that restarts starts with
an empty cache, and its feed says so).

Memory: KvBlockIndex keeps at most `max_blocks` ids per replica, about 78 bytes each
(kv/index.py, measured), so the gateway's default of 262,144 blocks (settings:
`kv_index_max_blocks`) is about 20 MB per replica at most: 4 million tokens of 16-token blocks,
more than one GPU's KV cache holds for most models; an engine's own capacity is the usual bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

import aiohttp

from gateway.routing.snapshot import RoutingSnapshot
from kv.feed import (
    FEED_PATH,
    MAX_LINE_BYTES,
    PING_EVERY_S,
    FeedLive,
    FeedMessage,
    FeedPing,
    FeedRemoved,
    FeedSnapshot,
    FeedStored,
    MalformedFeed,
    decode,
)
from kv.index import KvBlockIndex
from workflows.contracts import ReplicaState, Route
from workflows.engine_keys import kv_feed_token, node_secret

log = logging.getLogger(__name__)

RECONNECT_FIRST_S = 0.2
RECONNECT_MAX_S = 5.0
# A feed pings every PING_EVERY_S while quiet: three missed pings is a dead connection.
QUIET_LIMIT_S = 3 * PING_EVERY_S

# connecting (or waiting to), connected without a snapshot yet, reading a snapshot, live.
Phase = Literal["connecting", "connected", "snapshot", "live"]


@dataclass
class FeedCounters:
    """What one (feed, node) did, over every connection this gateway made to it."""

    lines: int = 0  # lines received
    malformed: int = 0  # lines that were not feed messages, or out of the protocol's order
    gaps: int = 0  # a seq that was not the last plus one (or, for a ping, the last)
    snapshots: int = 0  # snapshots begun
    resets: int = 0  # times this feed's replicas were dropped from the index (feed trouble)
    replica_resets: int = 0  # `reset` lines: the agent said a replica's cache is gone
    reconnects: int = 0  # connections after the first
    refused: int = 0  # the agent answered 401/403 (token)
    failures: int = 0  # connections that failed, answered another status, or ended
    quiet: int = 0  # connections dropped for sending no line in QUIET_LIMIT_S
    foreign: int = 0  # lines about a replica the routing table gives to another node


class _Dropped(Exception):
    """This connection cannot be trusted any further."""


class _Quiet(_Dropped):
    """No line came for too long."""


class _LineReader:
    """Lines of a response body, split here rather than by aiohttp's readline (whose buffer
    limit is below a feed's longest line), each bounded by MAX_LINE_BYTES."""

    def __init__(self, content: aiohttp.StreamReader, quiet_s: float) -> None:
        self._content = content
        self._quiet_s = quiet_s
        self._buffer = bytearray()
        self._start = 0

    async def next(self) -> bytes | None:
        """The next line without its newline; None at the end of the body. Raises _Dropped
        for a line too long, or for no line within `quiet_s`."""
        buffer = self._buffer
        try:
            async with asyncio.timeout(self._quiet_s):
                while True:
                    newline = buffer.find(b"\n", self._start)
                    if newline >= 0:
                        line = bytes(buffer[self._start : newline])
                        self._start = newline + 1
                        return line
                    del buffer[: self._start]
                    self._start = 0
                    if len(buffer) > MAX_LINE_BYTES:
                        raise MalformedFeed(f"a line longer than {MAX_LINE_BYTES} bytes")
                    chunk = await self._content.readany()
                    if not chunk:
                        return None
                    buffer += chunk
        except TimeoutError:
            raise _Quiet(f"no line for {self._quiet_s:g}s") from None


class KvFeedReader:
    """Reads one agent's feed into `index` until stopped; see the module's docstring."""

    def __init__(
        self,
        feed_url: str,
        node: str,
        token: str,
        index: KvBlockIndex,
        session: aiohttp.ClientSession,
        *,
        counters: FeedCounters | None = None,
        owns: Callable[[str], bool] | None = None,
        quiet_s: float = QUIET_LIMIT_S,
        first_backoff_s: float = RECONNECT_FIRST_S,
        max_backoff_s: float = RECONNECT_MAX_S,
    ) -> None:
        """`owns(replica_id)`: whether this feed may speak for that replica (default: any)."""
        self.feed_url = feed_url
        self.node = node
        self.url = feed_url.rstrip("/") + FEED_PATH
        self.counters = counters if counters is not None else FeedCounters()
        self._token = token
        self._index = index
        self._session = session
        self._owns = owns if owns is not None else _anyone
        self._quiet_s = quiet_s
        self._first_backoff_s = first_backoff_s
        self._max_backoff_s = max_backoff_s
        self.phase: Phase = "connecting"
        # The last snapshot's epoch and the last seq read (kept while reconnecting, for show).
        self.epoch: str | None = None
        self.seq: int | None = None
        self.last_error: str | None = None
        self._replicas: set[str] = set()  # replicas this feed told the index about
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    @property
    def connected(self) -> bool:
        return self.phase != "connecting"

    @property
    def live(self) -> bool:
        return self.phase == "live"

    def replicas(self) -> set[str]:
        return set(self._replicas)

    def start(self) -> None:
        if self._task is None and not self._stopped:
            self._task = asyncio.create_task(self._run(), name=f"kv-feed-{self.node}")

    def stop(self) -> asyncio.Task[None] | None:
        """Stop reading and forget this feed's replicas at once; the task, if any, ends on the
        loop's next turn (await it, or `close`)."""
        self._stopped = True
        self._forget()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        return task

    async def close(self) -> None:
        task = self.stop()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def disown(self) -> None:
        """Forget the replicas this feed may no longer speak for (the table moved them)."""
        for replica_id in [r for r in self._replicas if not self._owns(r)]:
            self._index.reset(replica_id)
            self._replicas.discard(replica_id)

    async def _run(self) -> None:
        delay = self._first_backoff_s
        first = True
        while not self._stopped:
            if not first:
                self.counters.reconnects += 1
            first = False
            went_live = False
            try:
                went_live = await self._read_once()
            except asyncio.CancelledError:
                self._forget()
                raise
            except Exception as exc:  # noqa: BLE001 - never out of the reader: counted, retried
                self.counters.failures += 1
                self._failed(repr(exc))
            self._forget()
            if went_live:
                delay = self._first_backoff_s
            await asyncio.sleep(delay * (0.5 + random.random() / 2))
            delay = min(delay * 2, self._max_backoff_s)

    async def _read_once(self) -> bool:
        """One connection, to its end; whether it got as far as live."""
        went_live = False
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/x-ndjson"}
        # The session's own read timeout (minutes, for engines) is not used: _LineReader bounds
        # each line's wait instead.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._quiet_s, sock_read=None)
        try:
            async with asyncio.timeout(self._quiet_s):
                response = await self._session.get(self.url, headers=headers, timeout=timeout)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            self.counters.failures += 1
            self._failed(f"connect: {exc!r}")
            return False
        async with response:
            if response.status in (401, 403):
                self.counters.refused += 1
                self._failed(f"refused ({response.status}): is the node's secret the same?")
                return False
            if response.status != 200:
                self.counters.failures += 1
                self._failed(f"answered {response.status}")
                return False
            self.phase = "connected"
            lines = _LineReader(response.content, self._quiet_s)
            try:
                while True:
                    line = await lines.next()
                    if line is None:
                        self.counters.failures += 1
                        self._failed("the feed ended")
                        return went_live
                    self.counters.lines += 1
                    self._apply(decode(line))
                    went_live = went_live or self.live
            except MalformedFeed as exc:
                self.counters.malformed += 1
                self._failed(f"malformed: {exc}")
            except _Dropped as exc:
                if isinstance(exc, _Quiet):
                    self.counters.quiet += 1
                self._failed(str(exc))
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                self.counters.failures += 1
                self._failed(f"read: {exc!r}")
        return went_live

    def _apply(self, message: FeedMessage) -> None:
        """One message into the index; raises _Dropped (after counting) when the feed can no
        longer be trusted."""
        if isinstance(message, FeedSnapshot):
            # What follows replaces all this feed said: at the start, or if an agent ever
            # sends a new snapshot on the same connection.
            self._forget(counted=False)
            self.phase = "snapshot"
            self.counters.snapshots += 1
            self.epoch, self.seq = message.epoch, message.seq
            for replica_id in message.replicas:
                if self._claim(replica_id):
                    self._index.reset(replica_id)
            return
        seq = self.seq
        if seq is None or self.phase in ("connecting", "connected"):
            raise self._malformed("a feed starts with its snapshot")
        if self.phase == "snapshot":
            if isinstance(message, FeedStored | FeedLive | FeedPing) and message.seq != seq:
                raise self._gap(message.seq, seq)
            if isinstance(message, FeedStored):
                if self._claim(message.replica):
                    self._index.store(message.replica, message.blocks)
            elif isinstance(message, FeedLive):
                self.phase = "live"
            elif not isinstance(message, FeedPing):
                raise self._malformed(f"{type(message).__name__} inside a snapshot")
            return
        if isinstance(message, FeedPing):
            if message.seq != seq:
                raise self._gap(message.seq, seq)
            return
        if isinstance(message, FeedLive):
            raise self._malformed("live twice")
        if message.seq != seq + 1:
            raise self._gap(message.seq, seq + 1)
        self.seq = message.seq
        if not self._claim(message.replica):
            return
        if isinstance(message, FeedStored):
            self._index.store(message.replica, message.blocks)
        elif isinstance(message, FeedRemoved):
            self._index.remove(message.replica, message.blocks)
        else:
            self.counters.replica_resets += 1
            self._index.reset(message.replica)

    def _claim(self, replica_id: str) -> bool:
        if not self._owns(replica_id):
            self.counters.foreign += 1
            return False
        self._replicas.add(replica_id)
        return True

    def _gap(self, got: int, wanted: int) -> _Dropped:
        self.counters.gaps += 1
        return _Dropped(f"seq {got} where {wanted} was due")

    def _malformed(self, why: str) -> _Dropped:
        self.counters.malformed += 1
        return _Dropped(f"malformed: {why}")

    def _forget(self, counted: bool = True) -> None:
        """Drop every replica this feed told the index about."""
        if self._replicas:
            if counted:
                self.counters.resets += 1
            for replica_id in self._replicas:
                self._index.reset(replica_id)
            self._replicas.clear()
        self.phase = "connecting"

    def _failed(self, why: str) -> None:
        if why != self.last_error:
            # Logged when the reason changes, not on every retry of an outage.
            log.warning("KV feed of node %s (%s): %s", self.node, self.url, why)
        self.last_error = why

    def describe(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "node": self.node,
            "connected": self.connected,
            "phase": self.phase,
            "epoch": self.epoch,
            "seq": self.seq,
            "last_error": self.last_error,
            "replicas": sorted(self._replicas),
            "counters": asdict(self.counters),
        }


def _anyone(_replica_id: str) -> bool:
    return True


FeedKey = tuple[str, str]  # (feed URL, node)


class KvFeeds:
    """The gateway's readers, one per agent feed in the routing table; see the module's
    docstring. `session` is the gateway's (or a test's) aiohttp session."""

    def __init__(
        self,
        index: KvBlockIndex,
        master_secret: bytes,
        session: aiohttp.ClientSession,
        *,
        quiet_s: float = QUIET_LIMIT_S,
        first_backoff_s: float = RECONNECT_FIRST_S,
        max_backoff_s: float = RECONNECT_MAX_S,
    ) -> None:
        self.index = index
        self._master = master_secret
        self._session = session
        self._timing = (quiet_s, first_backoff_s, max_backoff_s)
        self._readers: dict[FeedKey, KvFeedReader] = {}
        # Kept across a reader's stop and start: counters only grow, as Prometheus expects.
        self._counters: dict[FeedKey, FeedCounters] = {}
        # replica id -> the (feed, node) its route names (None: a route without kv).
        self._owner: dict[str, FeedKey | None] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    def readers(self) -> list[KvFeedReader]:
        return list(self._readers.values())

    def watching(self, route: Route) -> bool:
        """Whether the route's KV events reach the index now: its agent's feed is live."""
        if route.kv is None or not route.kv.feed:
            return False
        reader = self._readers.get((route.kv.feed, route.node))
        return reader is not None and reader.live

    def counters(self) -> dict[FeedKey, FeedCounters]:
        return dict(self._counters)

    def retain(self, snapshot: RoutingSnapshot) -> None:
        """Follow a new routing table: readers for the feeds of its READY routes with `kv`,
        none for the rest, and no index entry for a replica that is not READY."""
        routable = ReplicaState.routable()
        owner: dict[str, FeedKey | None] = {}
        wanted: set[FeedKey] = set()
        ready: set[str] = set()
        for route in snapshot.table.routes:
            # An external engine's route names its publisher instead (gateway/kv/publishers.py).
            key = (route.kv.feed, route.node) if route.kv is not None and route.kv.feed else None
            owner[route.replica_id] = key
            if route.state in routable:
                ready.add(route.replica_id)
                if key is not None:
                    wanted.add(key)
        self._owner = owner
        for key in [k for k in self._readers if k not in wanted]:
            task = self._readers.pop(key).stop()
            if task is not None:
                self._stopping.add(task)
                task.add_done_callback(self._stopping.discard)
        for key in sorted(wanted - set(self._readers)):
            self._readers[key] = reader = self._reader(key)
            reader.start()
        for reader in self._readers.values():
            reader.disown()
        for replica_id in self.index.replicas():
            if replica_id not in ready:
                self.index.reset(replica_id)

    def _reader(self, key: FeedKey) -> KvFeedReader:
        feed, node = key
        token = kv_feed_token(node_secret(self._master, node))
        counters = self._counters.setdefault(key, FeedCounters())

        def owns(replica_id: str) -> bool:
            found = self._owner.get(replica_id, key)
            return found == key

        quiet_s, first_backoff_s, max_backoff_s = self._timing
        return KvFeedReader(
            feed,
            node,
            token,
            self.index,
            self._session,
            counters=counters,
            owns=owns,
            quiet_s=quiet_s,
            first_backoff_s=first_backoff_s,
            max_backoff_s=max_backoff_s,
        )

    def describe(self) -> dict[str, Any]:
        """For GET /admin/v1/kv."""
        return {
            "feeds": [reader.describe() for reader in self._readers.values()],
            "replicas": {r: self.index.size(r) for r in sorted(self.index.replicas())},
        }

    async def close(self) -> None:
        tasks = [task for reader in self._readers.values() if (task := reader.stop())]
        self._readers.clear()
        tasks.extend(self._stopping)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
