"""KV-aware routing through a running gateway: it reads the node agent's feed with the node's
token, asks an engine for the prompt's tokens with that engine's key, sends the request to the
replica whose engine holds its leading blocks, and shows it all at /admin/v1/kv and /metrics."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from kv.hashes import block_ids
from store import Store
from tests.gateway_kit import (
    MODEL,
    FakeRouteSource,
    fast_settings,
    running_gateway,
    serving_vllm,
)
from tests.unit.test_gateway_proxy import metric
from tests.unit.test_kv_feeds import feed_server, opening, until
from workflows.contracts import KvSource, ReplicaState, Route
from workflows.engine_keys import engine_key_from_master, kv_feed_token, node_secret

NODE = "node-a"
TOKENS = list(range(1, 50))  # three blocks of 16, and one token more
BLOCKS = block_ids(TOKENS, 16, "0")


@dataclass
class Engine:
    """A vLLM stand-in: /tokenize, /metrics and chat completions reporting cached tokens."""

    replica_id: str
    key: str
    url: str = ""
    chats: int = 0
    tokenized: int = 0
    refused: list[str] = field(default_factory=list)


@asynccontextmanager
async def engine(replica_id: str, master: bytes) -> AsyncIterator[Engine]:
    standin = Engine(replica_id, engine_key_from_master(master, NODE, replica_id))

    def authorised(request: web.Request) -> bool:
        if request.headers.get("Authorization") == f"Bearer {standin.key}":
            return True
        standin.refused.append(request.path)
        return False

    async def tokenize(request: web.Request) -> web.Response:
        if not authorised(request):
            return web.Response(status=401)
        body = await request.json()
        assert body["add_generation_prompt"] is True
        standin.tokenized += 1
        return web.json_response({"count": len(TOKENS), "max_model_len": 4096, "tokens": TOKENS})

    async def chat(request: web.Request) -> web.Response:
        if not authorised(request):
            return web.Response(status=401)
        standin.chats += 1
        usage = {
            "prompt_tokens": len(TOKENS),
            "completion_tokens": 1,
            "prompt_tokens_details": {"cached_tokens": 32},
        }
        if (await request.json()).get("stream"):
            delta = {"index": 0, "delta": {"content": replica_id}, "finish_reason": "stop"}
            events = [
                {"object": "chat.completion.chunk", "choices": [delta]},
                {"object": "chat.completion.chunk", "choices": [], "usage": usage},
            ]
            text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
            return web.Response(text=text, content_type="text/event-stream")
        message = {"role": "assistant", "content": replica_id}
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": "stop"}
        return web.json_response({"object": "chat.completion", "choices": [choice], "usage": usage})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")

    async with serving_vllm(tokenize, chat, metrics) as url:
        standin.url = url
        yield standin


def kv_route(replica_id: str, endpoint: str, feed: str) -> Route:
    return Route(
        replica_id=replica_id,
        model=MODEL,
        node=NODE,
        endpoint=endpoint,
        engine="vllm",
        state=ReplicaState.READY,
        kv=KvSource(feed=feed, block_size=16, hash_seed="0"),
    )


async def test_a_request_goes_to_the_engine_holding_its_blocks(store: Store) -> None:
    master = await store.master_secret()
    token = kv_feed_token(node_secret(master, NODE))
    async with (
        feed_server(token) as feed,
        engine("r-a", master) as a,
        engine("r-b", master) as b,
    ):
        source = FakeRouteSource(kv_route("r-a", a.url, feed.url), kv_route("r-b", b.url, feed.url))
        settings = fast_settings(engine_scrape_interval_s=0.05)
        async with running_gateway(store, source, settings) as gw:
            conn = await feed.accepted()  # the right token, or the stand-in answers 401
            conn.send(*opening("e1", 4, {"r-a": [], "r-b": BLOCKS}))
            kv: dict[str, Any] = {}

            async def read_kv() -> None:
                kv.update((await gw.client.get("/admin/v1/kv")).json())

            deadline = time.monotonic() + 5
            while not (kv.get("feeds") and kv["feeds"][0]["phase"] == "live"):
                assert time.monotonic() < deadline, kv
                await read_kv()
            assert kv["replicas"] == {"r-b": 3}
            (shown,) = kv["feeds"]
            assert (shown["node"], shown["epoch"], shown["seq"]) == (NODE, "e1", 4)
            assert shown["counters"]["lines"] == 4

            for _ in range(3):
                response = await gw.chat(messages=[{"role": "user", "content": "hi"}])
                assert response.status_code == 200, response.text
                assert response.json()["choices"][0]["message"]["content"] == "r-b"
            streamed = await gw.chat(messages=[{"role": "user", "content": "hi"}], stream=True)
            assert streamed.status_code == 200
            assert '"content": "r-b"' in streamed.text
            assert (a.chats, b.chats) == (0, 4)
            assert a.tokenized + b.tokenized == 4
            assert a.refused == b.refused == []
            assert await metric(gw, "llmgw_routing_decisions_total", reason="kv_prefix") == 4
            assert await metric(gw, "llmgw_kv_tokenize_total", outcome="ok") == 4
            # Predicted 48 (three blocks), reported 32: off by 16 each time, streamed or not.
            error = "llmgw_kv_predicted_cached_tokens_error"
            assert await metric(gw, f"{error}_count", model=MODEL) == 4
            assert await metric(gw, f"{error}_bucket", le="0.0") == 0
            assert await metric(gw, f"{error}_bucket", le="16.0") == 4
            cached = "llmgw_kv_cached_tokens_total"
            assert await metric(gw, cached, model=MODEL, kind="predicted") == 4 * 48
            assert await metric(gw, cached, model=MODEL, kind="reported") == 4 * 32
            assert await metric(gw, "llmgw_kv_index_blocks", replica="r-b") == 3
            assert await metric(gw, "llmgw_kv_feed_lines_total", node=NODE) == 4

            # The agent goes away: the gateway forgets what it said, and routes as before.
            conn.hang_up()
            await until(lambda: not feed.live, what="the feed's connection to end")
            deadline = time.monotonic() + 5
            while kv["replicas"]:
                assert time.monotonic() < deadline, kv
                await read_kv()
            response = await gw.chat(messages=[{"role": "user", "content": "hi"}])
            assert response.status_code == 200
            assert await metric(gw, "llmgw_routing_decisions_total", reason="kv_prefix") == 4
            # With no engine known to hold anything, no engine is asked for tokens.
            assert a.tokenized + b.tokenized == 4
            assert await metric(gw, "llmgw_kv_tokenize_total", outcome="skipped") == 1


async def test_a_cold_model_with_its_feed_live_is_still_tokenized(store: Store) -> None:
    """No engine holds anything yet, but their events are heard: the first requests' token
    ids are asked for, so the blocks they will fill count in the next ones' predictions."""
    master = await store.master_secret()
    token = kv_feed_token(node_secret(master, NODE))
    async with feed_server(token) as feed, engine("r-a", master) as a:
        source = FakeRouteSource(kv_route("r-a", a.url, feed.url))
        async with running_gateway(store, source, fast_settings()) as gw:
            conn = await feed.accepted()
            conn.send(*opening("e1", 1, {"r-a": []}))

            deadline = time.monotonic() + 5
            while [f["phase"] for f in (await gw.client.get("/admin/v1/kv")).json()["feeds"]] != [
                "live"
            ]:
                assert time.monotonic() < deadline, "the feed never went live"
            response = await gw.chat(messages=[{"role": "user", "content": "hi"}])
            assert response.status_code == 200, response.text
            assert a.tokenized == 1
            assert await metric(gw, "llmgw_kv_tokenize_total", outcome="ok") == 1
            assert await metric(gw, "llmgw_kv_tokenize_total", outcome="skipped") == 0
