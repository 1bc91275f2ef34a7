"""Prefix-cache isolation per key through a running gateway: keys with `isolate_cache` send vLLM
their own `cache_salt`, the router hashes the prompt with that salt (so one key's cached blocks
never draw another key's request), a client's own salt goes after the key's, and other keys'
bodies, and bodies for models not served by vLLM alone, go upstream as they came."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from aiohttp import web

from kv.hashes import block_ids
from store import KeyLimits, Store
from tests.gateway_kit import (
    NODE,
    FakeRouteSource,
    Gateway,
    fast_settings,
    recording_upstream,
    running_gateway,
    serving_vllm,
)
from tests.unit.test_gateway_kv import TOKENS, kv_route
from tests.unit.test_gateway_proxy import metric
from tests.unit.test_kv_feeds import feed_server, opening
from workflows.contracts import ReplicaState, Route
from workflows.engine_keys import cache_salt_from_master, engine_key_from_master, kv_feed_token
from workflows.engine_keys import node_secret as derive_node_secret

# Longer than two of the prefix index's 256-byte blocks, so it would match there too.
PROMPT = [{"role": "user", "content": "the same long shared prompt " * 40}]
ISOLATED = KeyLimits(isolate_cache=True)


@dataclass
class Engine:
    """A vLLM stand-in: /tokenize, /metrics with a fixed load, and chat completions that keep
    every body they get."""

    replica_id: str
    key: str
    running: int
    url: str = ""
    bodies: list[dict[str, Any]] = field(default_factory=list)
    scrapes: int = 0


@asynccontextmanager
async def engine(replica_id: str, master: bytes, running: int = 0) -> AsyncIterator[Engine]:
    standin = Engine(replica_id, engine_key_from_master(master, NODE, replica_id), running)

    def authorised(request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {standin.key}"

    async def tokenize(request: web.Request) -> web.Response:
        if not authorised(request):
            return web.Response(status=401)
        body = await request.json()
        assert "cache_salt" not in body, "a salt does not change a prompt's tokens"
        return web.json_response({"count": len(TOKENS), "max_model_len": 4096, "tokens": TOKENS})

    async def chat(request: web.Request) -> web.Response:
        if not authorised(request):
            return web.Response(status=401)
        standin.bodies.append(await request.json())
        message = {"role": "assistant", "content": replica_id}
        usage = {"prompt_tokens": len(TOKENS), "completion_tokens": 1}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return web.json_response({"object": "chat.completion", "choices": [choice], "usage": usage})

    async def metrics(_: web.Request) -> web.Response:
        standin.scrapes += 1
        text = f"vllm:num_requests_running {standin.running}\nvllm:num_requests_waiting 0\n"
        return web.Response(text=text)

    async with serving_vllm(tokenize, chat, metrics) as url:
        standin.url = url
        yield standin


async def chat(gw: Gateway, api_key: str, **fields: Any) -> httpx.Response:
    body = {"model": fields.pop("model", "smol"), "messages": PROMPT, **fields}
    return await gw.client.post(
        "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {api_key}"}
    )


async def served_by(gw: Gateway, api_key: str, **fields: Any) -> str:
    response = await chat(gw, api_key, **fields)
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


async def test_isolated_keys_get_their_own_salts_and_never_route_by_each_others_blocks(
    store: Store,
) -> None:
    master = await store.master_secret()
    a, a_secret = await store.create_key("tenant-a", limits=ISOLATED)
    b, b_secret = await store.create_key("tenant-b", limits=ISOLATED)
    salt_a = cache_salt_from_master(master, a.key_id)
    salt_b = cache_salt_from_master(master, b.key_id)
    assert salt_a != salt_b
    # r-b's engine holds the prompt as tenant A's requests left it: hashed with A's salt.
    a_blocks = block_ids(TOKENS, 16, "0", [(("cache_salt", salt_a),)])
    token = kv_feed_token(derive_node_secret(master, NODE))
    async with (
        feed_server(token) as feed,
        engine("r-a", master) as free,
        engine("r-b", master, running=3) as holder,  # busier: only a cache hit draws a request
    ):
        source = FakeRouteSource(
            kv_route("r-a", free.url, feed.url), kv_route("r-b", holder.url, feed.url)
        )
        settings = fast_settings(engine_scrape_interval_s=0.05)
        async with running_gateway(store, source, settings) as gw:
            conn = await feed.accepted()
            conn.send(*opening("e1", 3, {"r-a": [], "r-b": a_blocks}))
            deadline = time.monotonic() + 5
            while True:
                kv = (await gw.client.get("/admin/v1/kv")).json()
                scraped = free.scrapes > 1 and holder.scrapes > 1  # a whole round at least
                if kv["replicas"] == {"r-b": 3} and scraped:
                    break
                assert time.monotonic() < deadline, kv
                await asyncio.sleep(0.02)

            # Tenant A's prompt: to the engine holding its blocks, with A's salt.
            for _ in range(2):
                assert await served_by(gw, a_secret) == "r-b"
            assert [body["cache_salt"] for body in holder.bodies] == [salt_a, salt_a]
            assert await metric(gw, "llmgw_routing_decisions_total", reason="kv_prefix") == 2

            # Tenant B, the same prompt: its salt matches nothing there, nor do A's requests in
            # the gateway's own prefix index; so the lighter replica, with B's salt.
            for _ in range(2):
                assert await served_by(gw, b_secret) == "r-a"
            assert [body["cache_salt"] for body in free.bodies] == [salt_b, salt_b]
            assert await metric(gw, "llmgw_routing_decisions_total", reason="kv_prefix") == 2

            # A client's own salt divides its key's cache: after A's salt, never in its place.
            assert await served_by(gw, a_secret, cache_salt="team-1") == "r-a"
            assert free.bodies[-1]["cache_salt"] == f"{salt_a}:team-1"
            assert await metric(gw, "llmgw_routing_decisions_total", reason="kv_prefix") == 2

            # A key without isolation: the body goes upstream as the client sent it (wherever
            # it goes: a new prefix, placed by what each replica was sent lately).
            engines = {"r-a": free, "r-b": holder}
            plain = engines[await served_by(gw, gw.api_key)]
            assert plain.bodies[-1] == {"model": "smol", "messages": PROMPT}
            mine = engines[await served_by(gw, gw.api_key, cache_salt="mine")]
            assert mine.bodies[-1] == {"model": "smol", "messages": PROMPT, "cache_salt": "mine"}
            assert await metric(gw, "llmgw_routing_decisions_total", reason="kv_prefix") == 2


def plain_route(replica_id: str, model: str, endpoint: str, engine: str) -> Route:
    return Route(
        replica_id=replica_id,
        model=model,
        node=NODE,
        endpoint=endpoint,
        engine=engine,
        state=ReplicaState.READY,
    )


async def test_a_model_not_served_by_vllm_alone_gets_no_salt(store: Store) -> None:
    master = await store.master_secret()
    tenant, secret = await store.create_key("tenant", limits=ISOLATED)
    salt = cache_salt_from_master(master, tenant.key_id)
    async with (
        recording_upstream() as vllm_only,
        recording_upstream() as mixed_vllm,
        recording_upstream() as mixed_llama,
        recording_upstream() as llama_only,
    ):
        source = FakeRouteSource(
            plain_route("v1", "vllm-only", vllm_only.url, "vllm"),
            plain_route("m1", "mixed", mixed_vllm.url, "vllm"),
            plain_route("m2", "mixed", mixed_llama.url, "llamacpp"),
            plain_route("l1", "llama", llama_only.url, "llamacpp"),
        )
        async with running_gateway(store, source) as gw:
            for model in ("vllm-only", "mixed", "mixed", "llama"):
                response = await chat(gw, secret, model=model)
                assert response.status_code == 200, response.text
            ((_, salted),) = vllm_only.seen
            assert salted["cache_salt"] == salt
            # A request may be retried on any ready replica: one that is not vLLM could refuse
            # the field, so a model with one gets none at all.
            others = [body for u in (mixed_vllm, mixed_llama, llama_only) for _, body in u.seen]
            assert sorted(body["model"] for body in others) == ["llama", "mixed", "mixed"]
            assert all(body == {"model": body["model"], "messages": PROMPT} for body in others)

            # A salt with no room left for the key's is refused, naming the field.
            long = await chat(gw, secret, model="vllm-only", cache_salt="x" * 1000)
            assert long.status_code == 400, long.text
            assert long.json()["error"]["param"] == "cache_salt"
            assert "at most 959 characters" in long.json()["error"]["message"]
            # Not a string, for any key: 400 before anything is sent.
            for api_key in (secret, gw.api_key):
                odd = await chat(gw, api_key, model="llama", cache_salt={"tenant": 1})
                assert odd.status_code == 400, odd.text
                assert odd.json()["error"]["param"] == "cache_salt"
            assert len(vllm_only.seen) + len(llama_only.seen) == 2
