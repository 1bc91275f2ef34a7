"""The gateway's subscriptions to external engines' KV-event publishers (gateway/kv/publishers.py)
against stand-in vLLM publishers on real ZMQ sockets on loopback: each publisher binds, as an
external vLLM with a wildcard endpoint does, and the gateway connects."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import zmq.asyncio

from gateway.kv.publishers import KvPublishers, KvSubscription
from gateway.routing import RequestKey, Router, RoutingSnapshot
from kv.hashes import block_ids
from kv.index import KvBlockIndex
from tests.ports import free_port
from tests.unit.kv_publisher_standin import TOPIC, StandinPublisher, restarted, until
from workflows.contracts import KvSource, ReplicaState, Route, RoutingTable

BLOCK = 16
TOKENS = tuple(range(1, 50))  # three full blocks and one token
HASHES = block_ids(TOKENS, BLOCK, "0")


def external_route(
    replica_id: str, publisher: str, replay: str = "", state: ReplicaState = ReplicaState.READY
) -> Route:
    return Route(
        replica_id=replica_id,
        model="m",
        node="external",
        endpoint=f"http://127.0.0.1:1/{replica_id}",
        engine="external",
        state=state,
        kv=KvSource(
            block_size=BLOCK, hash_seed="0", publisher=publisher, replay=replay, topic=TOPIC
        ),
    )


def table(*routes: Route) -> RoutingSnapshot:
    return RoutingSnapshot(RoutingTable(version=1, routes=list(routes)))


@dataclass
class Engine:
    """A stand-in external vLLM: its publisher and replay endpoints."""

    publisher: StandinPublisher
    endpoint: str
    replay: str


@dataclass
class Wired:
    ctx: zmq.asyncio.Context
    index: KvBlockIndex
    publishers: KvPublishers

    def engine(self) -> Engine:
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        replay = f"tcp://127.0.0.1:{free_port()}"
        return Engine(StandinPublisher(self.ctx, endpoint, replay, bind=True), endpoint, replay)

    def subscription(self, publisher: str) -> KvSubscription:
        (found,) = [s for s in self.publishers.subscriptions() if s.key[0] == publisher]
        return found


@pytest.fixture
async def wired() -> AsyncIterator[Wired]:
    ctx = zmq.asyncio.Context()
    index = KvBlockIndex()
    # Heartbeats fast enough for a test to see a silent publisher dropped.
    publishers = KvPublishers(index, heartbeat_s=0.2, silence_s=1.0, first_restart_s=0.05)
    try:
        yield Wired(ctx, index, publishers)
    finally:
        await publishers.close()
        ctx.destroy(linger=0)


async def heard(wired: Wired, engine: Engine, replica_id: str, blocks: list[int]) -> None:
    """ZMQ drops what a PUB sends before the subscriber's connection is up: publish seq 0 until
    the index holds it."""
    async with asyncio.timeout(5):
        while wired.index.size(replica_id) == 0:
            await engine.publisher.publish(0, blocks)
            await asyncio.sleep(0.02)


async def test_an_external_engines_events_fill_the_index_and_the_router_follows_them(
    wired: Wired,
) -> None:
    a, b = wired.engine(), wired.engine()
    routes = table(
        external_route("m/ext-0", a.endpoint, a.replay),
        external_route("m/ext-1", b.endpoint, b.replay),
    )
    wired.publishers.retain(routes)
    assert len(wired.publishers.subscriptions()) == 2
    await heard(wired, a, "m/ext-0", HASHES[:1])
    await heard(wired, b, "m/ext-1", HASHES[:1])
    await b.publisher.publish(1, HASHES[1:3])
    await until(lambda: wired.index.size("m/ext-1") == 3)
    assert wired.index.blocks("m/ext-0") == HASHES[:1]  # each engine's events, its replica's

    router = Router(kv_index=wired.index)
    decision = router.choose(routes, RequestKey("m", b"hello", token_ids=TOKENS), {}, now=0.0)
    assert decision.route is not None
    assert (decision.route.replica_id, decision.reason) == ("m/ext-1", "kv_prefix")
    assert decision.matched_blocks == 3
    assert wired.subscription(b.endpoint).connected
    shown = wired.subscription(b.endpoint).describe()
    assert (shown["replicas"], shown["engine_seq"], shown["connected"]) == (["m/ext-1"], 1, True)


async def test_a_gap_is_replayed_and_one_the_engine_no_longer_holds_starts_over(
    wired: Wired,
) -> None:
    engine = wired.engine()
    wired.publishers.retain(table(external_route("m/ext-0", engine.endpoint, engine.replay)))
    await heard(wired, engine, "m/ext-0", [10])
    await engine.publisher.publish(1, 11, send=False)  # lost on the way
    await engine.publisher.publish(2, 12)
    await until(lambda: wired.index.size("m/ext-0") == 3)
    assert wired.index.blocks("m/ext-0") == [10, 11, 12]
    counters = wired.subscription(engine.endpoint).counters
    assert (counters.gaps, counters.replays) == (1, 1)

    # Batches 3 and 4 are gone from the engine's buffer: what the replica holds is unknown,
    # so everything heard before is forgotten and the index starts again from batch 5.
    engine.publisher.buffer.clear()
    await engine.publisher.publish(5, 15)
    await until(lambda: wired.index.blocks("m/ext-0") == [15])
    assert counters.gaps == 2


async def test_without_a_replay_socket_a_gap_starts_over(wired: Wired) -> None:
    engine = wired.engine()
    wired.publishers.retain(table(external_route("m/ext-0", engine.endpoint)))
    await heard(wired, engine, "m/ext-0", [10])
    await engine.publisher.publish(2, 12)
    await until(lambda: wired.index.blocks("m/ext-0") == [12])
    assert wired.subscription(engine.endpoint).counters.replays == 1


async def test_a_restarted_publisher_resets_its_replica(wired: Wired) -> None:
    engine = wired.engine()
    wired.publishers.retain(table(external_route("m/ext-0", engine.endpoint, engine.replay)))
    await heard(wired, engine, "m/ext-0", [10])
    await engine.publisher.publish(1, 11)
    await until(lambda: wired.index.size("m/ext-0") == 2)
    counters = wired.subscription(engine.endpoint).counters
    resets = counters.resets

    # The engine restarts on the same connection: its sequence is back at 0.
    await engine.publisher.publish(0, 20)
    await until(lambda: wired.index.blocks("m/ext-0") == [20])
    assert counters.resets == resets + 1

    # The engine's process goes: the connection drops and its blocks are forgotten at once,
    # before anything else is heard. A new process on the same ports is picked up again.
    engine.publisher.close()
    await until(lambda: wired.index.size("m/ext-0") == 0)
    assert counters.disconnects == 1
    assert not wired.subscription(engine.endpoint).connected
    engine.publisher = await restarted(wired.ctx, engine.endpoint, engine.replay, bind=True)
    await heard(wired, engine, "m/ext-0", [30])
    assert wired.index.blocks("m/ext-0") == [30]
    assert counters.connects == 2
    engine.publisher.close()


_FROZEN = """
import sys, time, msgpack, zmq
pub = zmq.Context().socket(zmq.PUB)
pub.bind(sys.argv[1])
stored = {"type": "BlockStored", "block_hashes": [7], "token_ids": [1], "block_size": 1}
seq = 0
while True:
    pub.send_multipart([sys.argv[2].encode(), seq.to_bytes(8, "big"),
                        msgpack.packb([0.0, [stored], 0])])
    seq += 1
    time.sleep(0.05)
"""


async def test_a_publisher_that_goes_silent_is_dropped_and_forgotten(wired: Wired) -> None:
    # A frozen engine host keeps its TCP connection open and says nothing: only the ZMTP
    # heartbeats the gateway sends go unanswered.
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    proc = subprocess.Popen([sys.executable, "-c", _FROZEN, endpoint, TOPIC])
    try:
        wired.publishers.retain(table(external_route("m/ext-0", endpoint)))
        await until(lambda: wired.index.blocks("m/ext-0") == [7], timeout=10)
        os.kill(proc.pid, signal.SIGSTOP)
        await until(lambda: wired.index.size("m/ext-0") == 0)
        counters = wired.subscription(endpoint).counters
        assert counters.disconnects == 1
        assert counters.received > 0
    finally:
        proc.kill()
        proc.wait()


async def test_a_route_that_goes_stops_its_subscription_and_takes_its_blocks(
    wired: Wired,
) -> None:
    a = wired.engine()
    shared = external_route("m/ext-0", a.endpoint, a.replay)
    # One engine listed by two models: both replicas get its blocks.
    other = shared.model_copy(update={"replica_id": "other/ext-0", "model": "other"})
    wired.publishers.retain(table(shared, other))
    assert len(wired.publishers.subscriptions()) == 1
    await heard(wired, a, "m/ext-0", [10])
    assert wired.index.blocks("other/ext-0") == [10]

    wired.publishers.retain(table(shared))  # the other model went
    assert wired.index.size("other/ext-0") == 0
    await a.publisher.publish(1, 11)
    await until(lambda: wired.index.blocks("m/ext-0") == [10, 11])
    assert wired.index.size("other/ext-0") == 0

    stopping = shared.model_copy(update={"state": ReplicaState.STOPPING})
    wired.publishers.retain(table(stopping))
    assert wired.publishers.subscriptions() == []
    assert wired.index.size("m/ext-0") == 0
    received = wired.publishers.counters()[(a.endpoint, a.replay, TOPIC)].received
    for seq in range(2, 6):
        await a.publisher.publish(seq, seq + 10)
    await asyncio.sleep(0.2)
    assert wired.index.size("m/ext-0") == 0
    assert wired.publishers.counters()[(a.endpoint, a.replay, TOPIC)].received == received
    a.publisher.close()
