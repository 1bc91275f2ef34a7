"""The gateway's KV feed readers against a stand-in agent feed: snapshot and deltas into the
index, and every way a feed can go wrong (gap, malformed line, refused token, dropped or silent
connection) ending with that feed's replicas forgotten and a new snapshot asked for."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TypedDict, Unpack

import aiohttp
from aiohttp import web

from gateway.kv.feeds import KvFeedReader, KvFeeds
from gateway.metrics import GatewayMetrics
from gateway.routing import RoutingSnapshot
from kv.feed import (
    FEED_PATH,
    FeedLive,
    FeedMessage,
    FeedPing,
    FeedRemoved,
    FeedReset,
    FeedSnapshot,
    FeedStored,
    encode,
)
from kv.index import KvBlockIndex
from tests.gateway_kit import serving
from workflows.contracts import KvSource, ReplicaState, Route, RoutingTable
from workflows.engine_keys import kv_feed_token, node_secret

TOKEN = "feed-token"


class Timing(TypedDict, total=False):
    """The readers' timing keywords (KvFeedReader, KvFeeds)."""

    quiet_s: float
    first_backoff_s: float
    max_backoff_s: float


FAST: Timing = {"quiet_s": 2.0, "first_backoff_s": 0.01, "max_backoff_s": 0.05}


async def until(condition: Callable[[], bool], timeout: float = 5.0, what: str = "") -> None:
    """Wait for `condition`, failing after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what or condition}"
        await asyncio.sleep(0.005)


@dataclass
class Connection:
    """One reader's connection to the stand-in feed: the test writes its lines."""

    queue: asyncio.Queue[bytes | None] = field(default_factory=asyncio.Queue)
    closed: asyncio.Event = field(default_factory=asyncio.Event)

    def send(self, *messages: FeedMessage) -> None:
        for message in messages:
            self.queue.put_nowait(encode(message))

    def send_raw(self, line: bytes) -> None:
        self.queue.put_nowait(line)

    def hang_up(self) -> None:
        self.queue.put_nowait(None)


class FeedServer:
    """A node agent's feed, scripted by the test: each accepted connection waits for the lines
    the test sends it. `opening`, when set, is sent to every new connection first."""

    def __init__(self, token: str = TOKEN) -> None:
        self.token = token
        self.url = ""
        self.refused = 0
        self.opening: list[FeedMessage] = []
        self.live: list[Connection] = []
        self._accepted: asyncio.Queue[Connection] = asyncio.Queue()

    async def accepted(self, timeout: float = 5.0) -> Connection:
        return await asyncio.wait_for(self._accepted.get(), timeout)

    def broadcast(self, *messages: FeedMessage) -> None:
        for connection in self.live:
            connection.send(*messages)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            self.refused += 1
            return web.Response(status=401)
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        connection = Connection()
        connection.send(*self.opening)
        self.live.append(connection)
        self._accepted.put_nowait(connection)
        try:
            while True:
                try:
                    line = await asyncio.wait_for(connection.queue.get(), 0.02)
                except TimeoutError:
                    # aiohttp does not cancel a handler whose client left: look.
                    if request.transport is None or request.transport.is_closing():
                        break
                    continue
                if line is None:
                    break
                await response.write(line)
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            pass
        finally:
            self.live.remove(connection)
            connection.closed.set()
        return response


@asynccontextmanager
async def feed_server(token: str = TOKEN) -> AsyncIterator[FeedServer]:
    server = FeedServer(token)
    app = web.Application()
    app.router.add_get(FEED_PATH, server.handle)
    async with serving(app) as url:
        server.url = url
        try:
            yield server
        finally:
            for connection in list(server.live):
                connection.hang_up()


@asynccontextmanager
async def reader_of(
    server: FeedServer, index: KvBlockIndex, token: str = TOKEN, **options: Unpack[Timing]
) -> AsyncIterator[KvFeedReader]:
    async with aiohttp.ClientSession() as session:
        timing: Timing = {**FAST, **options}
        reader = KvFeedReader(server.url, "node-a", token, index, session, **timing)
        reader.start()
        try:
            yield reader
        finally:
            await reader.close()


def opening(epoch: str, seq: int, held: dict[str, list[int]]) -> list[FeedMessage]:
    """A snapshot of `held`, as an agent sends it."""
    stored: list[FeedMessage] = [FeedStored(seq, r, blocks) for r, blocks in held.items()]
    return [FeedSnapshot(epoch, seq, list(held)), *stored, FeedLive(seq)]


async def test_a_snapshot_then_deltas_fill_the_index() -> None:
    index = KvBlockIndex()
    async with feed_server() as server, reader_of(server, index) as reader:
        conn = await server.accepted()
        conn.send(*opening("e1", 5, {"r1": [1, 2, 3], "r2": [7]}))
        await until(lambda: reader.live, what="live")
        assert index.blocks("r1") == [1, 2, 3]
        assert index.blocks("r2") == [7]
        conn.send(
            FeedStored(6, "r1", [4]),
            FeedRemoved(7, "r1", [2]),
            FeedReset(8, "r2"),
            FeedPing(8),
            FeedStored(9, "r3", [11]),  # a replica that started after the snapshot
        )
        await until(lambda: reader.seq == 9, what="seq 9")
        assert index.blocks("r1") == [1, 3, 4]
        assert index.size("r2") == 0
        assert index.blocks("r3") == [11]
        assert (reader.epoch, reader.connected) == ("e1", True)
        counters = reader.counters
        assert (counters.lines, counters.snapshots, counters.replica_resets) == (9, 1, 1)
        assert (counters.gaps, counters.malformed, counters.resets, counters.reconnects) == (
            0,
            0,
            0,
            0,
        )
    # Stopped: what the feed said is forgotten.
    assert index.replicas() == []


async def test_a_seq_gap_forgets_the_feed_and_asks_for_a_new_snapshot() -> None:
    index = KvBlockIndex()
    async with feed_server() as server, reader_of(server, index) as reader:
        first = await server.accepted()
        first.send(*opening("e1", 5, {"r1": [1, 2]}))
        await until(lambda: reader.live)
        first.send(FeedStored(7, "r1", [3]))  # 6 never came
        second = await server.accepted()
        # Before the new snapshot arrives the old blocks are already gone: no route is chosen
        # on what a feed with a hole said.
        assert index.replicas() == []
        assert (reader.counters.gaps, reader.counters.resets) == (1, 1)
        assert reader.counters.reconnects == 1
        second.send(*opening("e1", 9, {"r1": [1, 2, 3]}))
        await until(lambda: reader.live)
        assert index.blocks("r1") == [1, 2, 3]
        assert reader.counters.snapshots == 2
        # A ping whose seq is not the last one's is a gap too.
        second.send(FeedPing(8))
        await server.accepted()
        assert index.replicas() == []
        assert reader.counters.gaps == 2


async def test_a_refused_token_is_counted_and_retried_and_nothing_is_indexed() -> None:
    index = KvBlockIndex()
    async with feed_server() as server, reader_of(server, index, token="wrong") as reader:
        await until(lambda: reader.counters.refused >= 3, what="three refusals")
        assert server.refused >= 3
        assert index.replicas() == []
        assert not reader.connected
        assert reader.counters.reconnects >= 2
        assert reader.last_error is not None
        assert "401" in reader.last_error


async def test_a_malformed_line_drops_the_connection_and_its_replicas() -> None:
    index = KvBlockIndex()
    async with feed_server() as server, reader_of(server, index) as reader:
        first = await server.accepted()
        first.send(*opening("e1", 1, {"r1": [1]}))
        await until(lambda: reader.live)
        first.send_raw(b'{"type": "stored", "seq": 2, "replica": "r1", "blocks": [-1]}\n')
        await server.accepted()
        assert reader.counters.malformed == 1
        assert index.replicas() == []
        assert reader.counters.lines == 4  # the malformed line counts as received


async def test_a_delta_before_the_connections_snapshot_is_malformed() -> None:
    index = KvBlockIndex()
    async with feed_server() as server, reader_of(server, index) as reader:
        first = await server.accepted()
        first.send(FeedStored(1, "r1", [1]))
        second = await server.accepted()
        assert reader.counters.malformed == 1
        assert index.replicas() == []
        second.send(*opening("e1", 1, {"r1": [1]}))
        await until(lambda: reader.live)
        second.hang_up()
        # A new connection must start with a snapshot too: a line carrying the last
        # snapshot's seq is not part of it.
        third = await server.accepted()
        third.send(FeedStored(1, "r1", [2]))
        await server.accepted()
        assert reader.counters.malformed == 2
        assert index.replicas() == []


async def test_a_line_longer_than_aiohttps_readline_limit_is_read() -> None:
    """Feed lines reach ~90 KB (4,096 20-digit ids); aiohttp's readline stops at 64 KiB."""
    index = KvBlockIndex()
    big = [2**64 - 1 - i for i in range(4096)]
    async with feed_server() as server, reader_of(server, index) as reader:
        conn = await server.accepted()
        conn.send(*opening("e1", 1, {"r1": big}))
        await until(lambda: reader.live)
        assert index.size("r1") == 4096
        assert reader.counters.malformed == 0


async def test_a_dropped_connection_forgets_its_replicas_and_reconnects() -> None:
    index = KvBlockIndex()
    async with feed_server() as server, reader_of(server, index) as reader:
        first = await server.accepted()
        first.send(*opening("e1", 1, {"r1": [1, 2]}))
        await until(lambda: reader.live)
        first.hang_up()
        second = await server.accepted()
        assert index.replicas() == []
        assert reader.counters.resets == 1
        # The agent restarted meanwhile: a new epoch, seq from 0.
        second.send(*opening("e2", 0, {"r1": [5]}))
        await until(lambda: reader.live)
        assert index.blocks("r1") == [5]
        assert reader.epoch == "e2"


async def test_a_silent_connection_is_dropped() -> None:
    index = KvBlockIndex()
    async with feed_server() as server, reader_of(server, index, quiet_s=0.3) as reader:
        first = await server.accepted()
        first.send(*opening("e1", 1, {"r1": [1]}))
        await until(lambda: reader.live)
        # No ping follows.
        await server.accepted()
        assert reader.counters.quiet == 1
        assert index.replicas() == []


async def test_two_gateways_fed_the_same_stream_hold_the_same_blocks() -> None:
    rng = random.Random(7)
    held: dict[str, list[int]] = {"r1": [rng.randrange(2**64) for _ in range(30)], "r2": []}
    deltas: list[FeedMessage] = []
    seq = 3
    for _ in range(300):
        seq += 1
        replica = rng.choice(["r1", "r2"])
        kind = rng.random()
        if kind < 0.6:
            deltas.append(FeedStored(seq, replica, [rng.randrange(40) for _ in range(5)]))
        elif kind < 0.95:
            deltas.append(FeedRemoved(seq, replica, [rng.randrange(40) for _ in range(5)]))
        else:
            deltas.append(FeedReset(seq, replica))
    # A small bound, so both evict, and must evict alike.
    a, b = KvBlockIndex(max_blocks=16), KvBlockIndex(max_blocks=16)
    async with feed_server() as server:
        server.opening = opening("e1", 3, held)
        async with reader_of(server, a) as one, reader_of(server, b) as two:
            await server.accepted()
            await server.accepted()
            await until(lambda: one.live and two.live)
            server.broadcast(*deltas)
            await until(lambda: one.seq == seq and two.seq == seq, what="both at the end")
            for replica in ("r1", "r2"):
                assert a.blocks(replica) == b.blocks(replica)
            assert a.size("r1") + a.size("r2") > 0


def kv_route(
    replica_id: str,
    feed: str,
    node: str = "node-a",
    state: ReplicaState = ReplicaState.READY,
) -> Route:
    return Route(
        replica_id=replica_id,
        model="m",
        node=node,
        endpoint="http://127.0.0.1:1",
        engine="vllm",
        state=state,
        kv=KvSource(feed=feed, block_size=16, hash_seed="0"),
    )


def table(*routes: Route, version: int = 1) -> RoutingSnapshot:
    return RoutingSnapshot(RoutingTable(version=version, routes=list(routes)))


async def test_retain_follows_the_routing_table() -> None:
    master = b"m" * 32
    index = KvBlockIndex()
    metrics = GatewayMetrics()
    async with feed_server(kv_feed_token(node_secret(master, "node-a"))) as server:
        async with aiohttp.ClientSession() as session:
            feeds = KvFeeds(index, master, session, **FAST)
            metrics.watch_kv(feeds)
            try:
                # Nothing READY with kv: no reader.
                feeds.retain(table(kv_route("r1", server.url, state=ReplicaState.LOADING)))
                assert feeds.readers() == []

                # r1 and r2 ready on node-a, r9 on node-b: one reader, the node's own token.
                feeds.retain(
                    table(
                        kv_route("r1", server.url),
                        kv_route("r2", server.url),
                        kv_route("r9", "http://127.0.0.1:1", node="node-b"),
                    )
                )
                conn = await server.accepted()
                nodes = sorted(r.node for r in feeds.readers())
                assert nodes == ["node-a", "node-b"]
                reader = next(r for r in feeds.readers() if r.node == "node-a")
                # The feed also names r9, which the table gives to node-b: not taken.
                conn.send(*opening("e1", 1, {"r1": [1, 2], "r2": [3], "r9": [4]}))
                await until(lambda: reader.live)
                assert sorted(index.replicas()) == ["r1", "r2"]
                assert reader.counters.foreign == 2  # its name in the snapshot, its blocks
                described = feeds.describe()
                assert described["replicas"] == {"r1": 2, "r2": 1}
                feed = next(f for f in described["feeds"] if f["node"] == "node-a")
                assert (feed["connected"], feed["epoch"], feed["seq"]) == (True, "e1", 1)
                assert feed["counters"]["snapshots"] == 1
                exposition = metrics.exposition().decode()
                assert 'llmgw_kv_feed_lines_total{node="node-a"} 5.0' in exposition
                assert 'llmgw_kv_feed_connected{node="node-a"} 1.0' in exposition
                assert 'llmgw_kv_index_blocks{replica="r1"} 2.0' in exposition

                # r2 restarts (not READY): its blocks go; the feed stays for r1.
                feeds.retain(
                    table(
                        kv_route("r1", server.url),
                        kv_route("r2", server.url, state=ReplicaState.STARTING),
                        version=2,
                    )
                )
                assert index.replicas() == ["r1"]
                assert [r.node for r in feeds.readers()] == ["node-a"]

                # node-a's replicas leave: its reader stops and forgets them.
                feeds.retain(table(version=3))
                assert feeds.readers() == []
                assert index.replicas() == []
                await asyncio.wait_for(conn.closed.wait(), 5)

                # And a new one comes back with the next table.
                feeds.retain(table(kv_route("r1", server.url), version=4))
                again = await server.accepted()
                again.send(*opening("e1", 7, {"r1": [9]}))
                await until(lambda: index.blocks("r1") == [9])
                # Counters carried over: one (feed, node), counted since the first reader.
                assert feeds.counters()[(server.url, "node-a")].snapshots == 2
            finally:
                await feeds.close()
        assert index.replicas() == []
