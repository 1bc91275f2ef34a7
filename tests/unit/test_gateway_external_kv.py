"""KV-aware routing to an external vLLM fleet through a running gateway: the gateway connects to
each engine's own publisher (no node agent), asks an engine's /tokenize with the model's
upstream key and upstream name, sends the request to the engine holding its leading blocks, and
shows the subscriptions at /admin/v1/kv and /metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import zmq.asyncio
from aiohttp import web

from kv.hashes import block_ids
from store import Store
from tests.gateway_kit import (
    MODEL,
    FakeRouteSource,
    Gateway,
    fast_settings,
    running_gateway,
    serving,
)
from tests.ports import free_port
from tests.unit.kv_publisher_standin import TOPIC, StandinPublisher
from tests.unit.test_gateway_proxy import metric
from workflows.contracts import KvSource, ReplicaState, Route, RoutingTable

UPSTREAM_KEY = "sk-external-fleet"
UPSTREAM_MODEL = "org/Fleet-8B"
TOKENS = list(range(1, 50))  # three blocks of 16, and one token more
BLOCKS = block_ids(TOKENS, 16, "0")


@dataclass
class Engine:
    """An external vLLM stand-in: /tokenize and chat completions, behind the fleet's key."""

    name: str
    url: str = ""
    chats: int = 0
    tokenized: list[dict[str, Any]] = field(default_factory=list)
    refused: int = 0


@asynccontextmanager
async def engine(name: str) -> AsyncIterator[Engine]:
    standin = Engine(name)

    def authorised(request: web.Request) -> bool:
        if request.headers.get("Authorization") == f"Bearer {UPSTREAM_KEY}":
            return True
        standin.refused += 1
        return False

    async def tokenize(request: web.Request) -> web.Response:
        if not authorised(request):
            return web.Response(status=401)
        body = await request.json()
        if body.get("model") != UPSTREAM_MODEL:  # vLLM refuses a model it does not serve
            return web.json_response({"error": "model not found"}, status=404)
        standin.tokenized.append(body)
        return web.json_response({"count": len(TOKENS), "max_model_len": 4096, "tokens": TOKENS})

    async def chat(request: web.Request) -> web.Response:
        if not authorised(request):
            return web.Response(status=401)
        standin.chats += 1
        message = {"role": "assistant", "content": name}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        usage = {"prompt_tokens": len(TOKENS), "completion_tokens": 1}
        return web.json_response({"object": "chat.completion", "choices": [choice], "usage": usage})

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/v1/chat/completions", chat)
    async with serving(app) as url:
        standin.url = url
        yield standin


def external(replica_id: str, url: str, publisher: str, replay: str) -> Route:
    return Route(
        replica_id=replica_id,
        model=MODEL,
        node="external",
        endpoint=url,
        engine="external",
        state=ReplicaState.READY,
        upstream_model=UPSTREAM_MODEL,
        kv=KvSource(block_size=16, hash_seed="0", publisher=publisher, replay=replay, topic=TOPIC),
    )


async def admin_kv(gw: Gateway, until: Any, what: str) -> dict[str, Any]:
    """GET /admin/v1/kv until `until(answer)` holds."""
    deadline = time.monotonic() + 5
    while True:
        shown: dict[str, Any] = (await gw.client.get("/admin/v1/kv")).json()
        if until(shown):
            return shown
        assert time.monotonic() < deadline, f"{what}: {shown}"
        await asyncio.sleep(0.02)


async def test_requests_follow_the_blocks_an_external_engine_reports(store: Store) -> None:
    await store.set_upstream_key(MODEL, UPSTREAM_KEY)
    ctx = zmq.asyncio.Context()
    pub_a, pub_b = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    replay_a, replay_b = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    publisher_a = StandinPublisher(ctx, pub_a, replay_a, bind=True)
    publisher_b = StandinPublisher(ctx, pub_b, replay_b, bind=True)
    try:
        async with engine("a") as a, engine("b") as b:
            source = FakeRouteSource(
                external(f"{MODEL}/ext-0", a.url, pub_a, replay_a),
                external(f"{MODEL}/ext-1", b.url, pub_b, replay_b),
            )
            settings = fast_settings(engine_scrape_interval_s=0.05)
            async with running_gateway(store, source, settings) as gw:
                shown = await admin_kv(
                    gw, lambda kv: len(kv["publishers"]) == 2, "both subscriptions"
                )
                # Engine b stores the prompt's three blocks; ZMQ drops what a PUB sends
                # before the subscriber is connected, so it says so until the gateway knows.
                deadline = time.monotonic() + 5
                while not shown["replicas"]:
                    assert time.monotonic() < deadline, shown
                    await publisher_b.publish(0, BLOCKS)
                    shown = (await gw.client.get("/admin/v1/kv")).json()
                    await asyncio.sleep(0.02)
                assert shown["replicas"] == {f"{MODEL}/ext-1": 3}
                (seen_b,) = [p for p in shown["publishers"] if p["publisher"] == pub_b]
                assert (seen_b["replay"], seen_b["replicas"]) == (replay_b, [f"{MODEL}/ext-1"])
                assert seen_b["connected"] is True

                for _ in range(3):
                    response = await gw.chat(messages=[{"role": "user", "content": "hi"}])
                    assert response.status_code == 200, response.text
                    assert response.json()["choices"][0]["message"]["content"] == "b"
                assert (a.chats, b.chats) == (0, 3)
                # Tokenized by one of the fleet, with its key and the name it serves.
                asked = a.tokenized + b.tokenized
                assert len(asked) == 3
                assert a.refused == b.refused == 0
                assert await metric(gw, "llmgw_routing_decisions_total", reason="kv_prefix") == 3
                assert await metric(gw, "llmgw_kv_tokenize_total", outcome="ok") == 3
                assert await metric(gw, "llmgw_kv_publisher_received_total", publisher=pub_b) >= 1
                assert await metric(gw, "llmgw_kv_publisher_connected", publisher=pub_b) == 1
                assert await metric(gw, "llmgw_kv_index_blocks", replica=f"{MODEL}/ext-1") == 3

                # The model's events are dropped from its definition: no subscription is left,
                # nothing is held, and requests route as before.
                source.table = RoutingTable(
                    version=2,
                    routes=[r.model_copy(update={"kv": None}) for r in source.table.routes],
                )
                shown = await admin_kv(
                    gw, lambda kv: not kv["publishers"], "the subscriptions to stop"
                )
                assert shown["replicas"] == {}
                assert (await gw.chat()).status_code == 200
                assert await metric(gw, "llmgw_routing_decisions_total", reason="kv_prefix") == 3
                assert len(a.tokenized + b.tokenized) == 3
    finally:
        publisher_a.close()
        publisher_b.close()
        ctx.destroy(linger=0)
