"""The agent's KV feed end to end on loopback: a stand-in vLLM publisher on real ZMQ sockets,
the agent's subscriptions and hub, its aiohttp feed server, and a reader doing what a gateway
does (kv/feed.py)."""

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
import zmq.asyncio

from activities.agent.kv import feed_server as kv_feed_server
from activities.agent.kv.feed_server import STATUS_PATH, FeedServer, start_feed_server
from activities.agent.kv.hub import KvHub
from activities.agent.kv.subscriptions import KvSubscriptions
from engines.adapter import KvPublisher
from kv.events import BlockStored
from kv.feed import (
    FEED_PATH,
    FeedLive,
    FeedMessage,
    FeedPing,
    FeedReset,
    FeedSnapshot,
    FeedStored,
    decode,
)
from tests.ports import free_port
from tests.unit.kv_publisher_standin import TOPIC, StandinPublisher, restarted, until
from workflows.engine_keys import kv_feed_token

SECRET = b"node-secret-for-tests-0123456789"
TOKEN = kv_feed_token(SECRET)


def publisher_on_free_ports() -> KvPublisher:
    return KvPublisher(
        endpoint=f"tcp://127.0.0.1:{free_port()}",
        replay_endpoint=f"tcp://127.0.0.1:{free_port()}",
        topic=TOPIC,
        block_size=16,
        hash_seed="0",
    )


@dataclass
class Agent:
    ctx: zmq.asyncio.Context
    hub: KvHub
    subscriptions: KvSubscriptions
    server: FeedServer

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.port}{path}"


@pytest.fixture
async def agent() -> AsyncIterator[Agent]:
    ctx = zmq.asyncio.Context()
    hub = KvHub(max_pending=500)
    subscriptions = KvSubscriptions(hub, ctx)
    server = await start_feed_server(hub, SECRET, "127.0.0.1", 0)
    try:
        yield Agent(ctx, hub, subscriptions, server)
    finally:
        await server.stop()
        await subscriptions.close()
        ctx.destroy(linger=0)  # whatever a failed test left open


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


class FeedReading:
    """A gateway's connection to the feed: every line decoded onto a queue as it arrives."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.lines: asyncio.Queue[FeedMessage | None] = asyncio.Queue()  # None: the end
        self.task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            async for line in self.response.content:
                self.lines.put_nowait(decode(line))
        except aiohttp.ClientPayloadError:
            pass  # the agent dropped the connection mid-stream
        finally:
            self.lines.put_nowait(None)

    async def next(self, timeout: float = 5.0) -> FeedMessage | None:
        async with asyncio.timeout(timeout):
            return await self.lines.get()

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        self.response.close()


async def open_feed(http: aiohttp.ClientSession, agent: Agent) -> FeedReading:
    response = await http.get(agent.url(FEED_PATH), headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status == 200
    assert response.headers["Content-Type"] == "application/x-ndjson"
    return FeedReading(response)


async def until_heard(agent: Agent, publisher: StandinPublisher, replica: str, block: int) -> None:
    """ZMQ drops what a PUB sends before its connection is up: publish seq 0 until it lands."""
    async with asyncio.timeout(5):
        while block not in agent.hub.blocks(replica):
            await publisher.publish(0, block)
            await asyncio.sleep(0.02)


async def test_the_feed_and_status_refuse_a_missing_or_wrong_token(
    agent: Agent, http: aiohttp.ClientSession
) -> None:
    for path in (FEED_PATH, STATUS_PATH):
        for headers in (
            {},
            {"Authorization": "Bearer " + "0" * len(TOKEN)},
            {"Authorization": f"Basic {TOKEN}"},
            {"Authorization": TOKEN},
        ):
            async with http.get(agent.url(path), headers=headers) as response:
                assert response.status == 401, (path, headers)
                assert "token" in (await response.json())["error"]
    assert agent.hub.readers == 0


async def test_a_reader_gets_the_snapshot_then_engine_events_within_a_second(
    agent: Agent, http: aiohttp.ClientSession
) -> None:
    published = publisher_on_free_ports()
    await agent.subscriptions.sync({"m-0": published})
    engine = StandinPublisher(agent.ctx, published.endpoint, published.replay_endpoint)
    try:
        await until_heard(agent, engine, "m-0", 1000)
        feed = await open_feed(http, agent)
        snapshot = await feed.next()
        assert isinstance(snapshot, FeedSnapshot)
        assert snapshot.replicas == ["m-0"]
        seq = snapshot.seq
        assert await feed.next() == FeedStored(seq, "m-0", [1000])
        assert await feed.next() == FeedLive(seq)

        sent = time.monotonic()
        await engine.publish(1, [1001, 1002])
        assert await feed.next() == FeedStored(seq + 1, "m-0", [1001, 1002])
        latency = time.monotonic() - sent
        print(f"engine event to feed line: {latency * 1000:.1f} ms")
        assert latency < 1.0

        # The engine restarts: its sequence starts at 0 again, and all it held is gone.
        engine.close()
        engine = await restarted(agent.ctx, published.endpoint, published.replay_endpoint)
        await until_heard(agent, engine, "m-0", 2000)
        assert await feed.next() == FeedReset(seq + 2, "m-0")
        assert await feed.next() == FeedStored(seq + 3, "m-0", [2000])
        assert agent.hub.blocks("m-0") == [2000]

        async with http.get(
            agent.url(STATUS_PATH), headers={"Authorization": f"Bearer {TOKEN}"}
        ) as response:
            status = await response.json()
        replica = status["replicas"]["m-0"]
        assert replica["blocks"] == 1
        assert replica["endpoint"] == published.endpoint
        assert replica["subscribed"] is True
        assert replica["engine_seq"] == 0
        assert replica["counters"]["resets"] >= 2  # the first batch heard, and the restart
        assert status["readers"] == 1
        await feed.close()
    finally:
        engine.close()


async def test_a_quiet_feed_pings_with_the_last_seq_and_a_stop_ends_it(
    agent: Agent, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kv_feed_server, "PING_EVERY_S", 0.05)  # 5 s in earnest
    agent.hub.apply("m-0", [BlockStored([7], None, [1], 1)])
    feed = await open_feed(http, agent)
    assert await feed.next() == FeedSnapshot(agent.hub.epoch, 1, ["m-0"])
    assert await feed.next() == FeedStored(1, "m-0", [7])
    assert await feed.next() == FeedLive(1)
    assert await feed.next() == FeedPing(1)
    agent.hub.reset("m-0")
    assert await feed.next() == FeedReset(2, "m-0")
    assert await feed.next() == FeedPing(2)
    # Stopping the agent ends the stream at once rather than wait out a gateway's connection.
    async with asyncio.timeout(2):
        await agent.server.stop()
    assert await feed.next() is None
    assert agent.hub.readers == 0
    await feed.close()


async def test_a_reader_that_falls_too_far_behind_is_disconnected(
    agent: Agent, http: aiohttp.ClientSession
) -> None:
    feed = await open_feed(http, agent)
    assert isinstance(await feed.next(), FeedSnapshot)
    assert isinstance(await feed.next(), FeedLive)
    for i in range(600):  # 2 each against a bound of 500, with no chance to write any
        agent.hub.apply("m-0", [BlockStored([i], None, [1], 1)])
    while (message := await feed.next()) is not None:
        raise AssertionError(f"a line after the overflow: {message}")
    await until(lambda: agent.hub.readers == 0)
    await feed.close()
    # The gateway reconnects and gets a snapshot of all of it.
    again = await open_feed(http, agent)
    assert isinstance(await again.next(), FeedSnapshot)
    assert await again.next() == FeedStored(600, "m-0", list(range(600)))
    await again.close()


async def test_sync_follows_the_engines_the_supervisor_records(agent: Agent) -> None:
    first = publisher_on_free_ports()
    await agent.subscriptions.sync({"m-0": first})
    engine = StandinPublisher(agent.ctx, first.endpoint, first.replay_endpoint)
    try:
        await until_heard(agent, engine, "m-0", 1000)
        reader = agent.hub.attach()
        reader.take(10)

        # Gone from the supervisor's records: its blocks go, and the gateways are told.
        await agent.subscriptions.sync({})
        assert agent.subscriptions.replicas() == []
        assert agent.hub.blocks("m-0") == []
        assert reader.take(10) == [FeedReset(agent.hub.seq, "m-0")]
        assert "m-0" not in agent.hub.status()["replicas"]  # type: ignore[operator]
    finally:
        engine.close()

    # A port someone else holds: counted, not fatal, and bound at a later sync once free.
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    moved = KvPublisher(f"tcp://127.0.0.1:{port}", first.replay_endpoint, TOPIC, 16, None)
    await agent.subscriptions.sync({"m-1": moved})
    failed = agent.hub.status()["replicas"]["m-1"]  # type: ignore[index]
    assert failed["subscribed"] is False
    assert failed["bind_failures"] == 1
    held.close()
    await agent.subscriptions.sync({"m-1": moved})
    assert agent.subscriptions.replicas() == ["m-1"]
    # The agent's own: a relaunch of m-1's engine is not refused for it (node_agent.py).
    assert agent.subscriptions.listening_ports() == {port}
    assert agent.hub.status()["replicas"]["m-1"]["subscribed"] is True  # type: ignore[index]

    # Relaunched on other ports: a new subscriber there, the old port free again.
    relaunched = publisher_on_free_ports()
    await agent.subscriptions.sync({"m-1": relaunched})
    assert agent.hub.status()["replicas"]["m-1"]["endpoint"] == relaunched.endpoint  # type: ignore[index]
    await until(lambda: port_free(port))  # ZMQ closes a socket in its own thread


def port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
