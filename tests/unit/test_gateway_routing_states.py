"""Routing states through a running gateway: a vLLM replica whose KV feed the gateway is not
hearing is routed `degraded`, and said so in its log, then `exact` once the feed is live; a
llama.cpp replica is routed `approximate`; and a replica predicted to hold a prompt's prefix
whose engine reports not holding it counts as an incorrect route, on /metrics and in the
console's JSON (docs/routing-states.md)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web

from kv.hashes import block_ids
from store import Store
from tests.gateway_kit import (
    MODEL,
    FakeRouteSource,
    Gateway,
    fast_settings,
    route,
    running_gateway,
    serving,
)
from tests.unit.test_gateway_kv import kv_route
from tests.unit.test_gateway_proxy import metric
from tests.unit.test_kv_feeds import feed_server, opening, until
from workflows.engine_keys import kv_feed_token, node_secret

NODE = "node-a"
TOKENS = list(range(1, 50))  # three blocks of 16, and one token more: 48 predicted
BLOCKS = block_ids(TOKENS, 16, "0")
STATE = "llmgw_routing_state_total"
LOGGER = "gateway.replica_attempts"


@dataclass
class Engine:
    """An engine stand-in whose reported cached tokens the test sets: in its usage's details
    (vLLM; llama-server since early 2026), or only in llama-server's `timings.cache_n`."""

    replica_id: str
    cached: int = 0
    in_timings_only: bool = False
    url: str = ""
    chats: int = 0


@asynccontextmanager
async def engine(replica_id: str) -> AsyncIterator[Engine]:
    standin = Engine(replica_id)

    async def tokenize(_: web.Request) -> web.Response:
        return web.json_response({"count": len(TOKENS), "max_model_len": 4096, "tokens": TOKENS})

    async def chat(request: web.Request) -> web.Response:
        standin.chats += 1
        usage: dict[str, Any] = {"prompt_tokens": len(TOKENS), "completion_tokens": 1}
        extra: dict[str, Any] = {}
        if standin.in_timings_only:
            extra["timings"] = {"cache_n": standin.cached, "prompt_n": len(TOKENS)}
        else:
            usage["prompt_tokens_details"] = {"cached_tokens": standin.cached}
        if (await request.json()).get("stream"):
            delta = {"index": 0, "delta": {"content": replica_id}, "finish_reason": "stop"}
            events = [
                {"object": "chat.completion.chunk", "choices": [delta]},
                {"object": "chat.completion.chunk", "choices": [], "usage": usage, **extra},
            ]
            text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
            return web.Response(text=text, content_type="text/event-stream")
        message = {"role": "assistant", "content": replica_id}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        body = {"object": "chat.completion", "choices": [choice], "usage": usage, **extra}
        return web.json_response(body)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/metrics", metrics)
    async with serving(app) as url:
        standin.url = url
        yield standin


async def states_of(gw: Gateway) -> dict[str, Any]:
    """The console's routing-state row for the model."""
    data = (await gw.client.get("/admin/v1/console")).json()
    (row,) = [r for r in data["gateway"]["routing_states"] if r["model"] == MODEL]
    return dict(row)


async def chat_answered_by(gw: Gateway, content: str = "hi", **body: Any) -> str:
    response = await gw.chat(messages=[{"role": "user", "content": content}], **body)
    assert response.status_code == 200, response.text
    if body.get("stream"):
        return response.text
    return str(response.json()["choices"][0]["message"]["content"])


async def test_a_kv_route_not_heard_is_degraded_then_exact_and_a_miss_is_incorrect(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    master = await store.master_secret()
    token = kv_feed_token(node_secret(master, NODE))
    async with feed_server(token) as feed, engine("r-a") as a, engine("r-b") as b:
        source = FakeRouteSource(kv_route("r-a", a.url, feed.url), kv_route("r-b", b.url, feed.url))
        async with running_gateway(store, source, fast_settings()) as gw:
            # Connected to the agent's feed, which has not sent its snapshot yet.
            conn = await feed.accepted()
            for _ in range(2):
                await chat_answered_by(gw)
            assert await metric(gw, STATE, model=MODEL, state="degraded", why="no_snapshot") == 2
            (said,) = [r for r in caplog.records if "routing of model" in r.getMessage()]
            assert said.levelno == logging.WARNING
            assert said.getMessage() == (
                f"routing of model {MODEL}: degraded (no_snapshot; 1 of 1 decisions in the "
                "last 20s)"
            )

            # The feed goes live: r-b's engine holds three blocks of the prompt.
            conn.send(*opening("e1", 4, {"r-a": [], "r-b": BLOCKS}))
            deadline = time.monotonic() + 5
            while (await gw.client.get("/admin/v1/kv")).json()["replicas"] != {"r-b": 3}:
                assert time.monotonic() < deadline, "the feed never went live"
            b.cached = 32  # of 48 predicted: a tail evicted, the route still right
            for _ in range(2):
                assert await chat_answered_by(gw) == "r-b"
            assert await metric(gw, STATE, model=MODEL, state="exact", why="kv_events") == 2
            assert await metric(gw, "llmgw_routing_predicted_total", state="exact") == 2
            assert await metric(gw, "llmgw_routing_incorrect_total", state="exact") == 0

            # The engine says it held none of it, streamed or not: both incorrect routes.
            b.cached = 0
            assert await chat_answered_by(gw) == "r-b"
            assert '"r-b"' in await chat_answered_by(gw, stream=True)
            assert await metric(gw, "llmgw_routing_predicted_total", state="exact") == 4
            assert await metric(gw, "llmgw_routing_incorrect_total", state="exact") == 2

            row = await states_of(gw)
            assert row["decisions"] == {"exact": 4, "approximate": 0, "degraded": 2, "fallback": 0}
            assert row["incorrect_rate"] == 0.5
            # Within 10 s of the first line, the state shown holds (one line per model per 10 s).
            assert (row["state"], row["why"]) == ("degraded", "no_snapshot")


async def test_a_llamacpp_route_is_approximate_and_counted_incorrect_on_its_cache_n(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    # Two 256-byte blocks and more: long enough to start a prefix, then to match it.
    prompt = "Otters hold hands while they sleep so they do not drift apart. " * 10
    async with engine("l-a") as a, engine("l-b") as b:
        source = FakeRouteSource(route("l-a", a.url), route("l-b", b.url))
        async with running_gateway(store, source, fast_settings()) as gw:
            first = await chat_answered_by(gw, prompt)
            (said,) = [
                r.getMessage() for r in caplog.records if "routing of model" in r.getMessage()
            ]
            assert said == (
                f"routing of model {MODEL}: approximate (new_prefix; 1 of 1 decisions in the "
                "last 20s)"
            )
            holder = a if first == "l-a" else b
            # An older llama-server: its cached tokens only in `timings.cache_n`.
            holder.in_timings_only = True
            holder.cached = 0
            assert await chat_answered_by(gw, prompt) == first
            holder.cached = 600
            assert await chat_answered_by(gw, prompt) == first

            assert await metric(gw, STATE, model=MODEL, state="approximate", why="new_prefix") == 1
            assert await metric(gw, STATE, model=MODEL, state="approximate", why="sent_record") == 2
            # The first placed a new prefix: nothing predicted. Then one miss, one hit.
            assert await metric(gw, "llmgw_routing_predicted_total", state="approximate") == 2
            assert await metric(gw, "llmgw_routing_incorrect_total", state="approximate") == 1
            # A llama.cpp route never takes a KV-events state.
            assert await metric(gw, STATE, state="exact") == 0
            assert await metric(gw, STATE, state="degraded") == 0
            row = await states_of(gw)
            assert (row["state"], row["decisions"]["approximate"], row["incorrect_rate"]) == (
                "approximate",
                3,
                0.5,
            )
            await until(lambda: a.chats + b.chats == 3)
