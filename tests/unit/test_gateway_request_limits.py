"""Limits a client meets through the running gateway, before an engine sees anything: a request
too large for one engine is a 400, and a model whose replicas are all full is a 429."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiohttp import web

from store import KeyLimits, Store
from tests.gateway_kit import (
    MODEL,
    FakeRouteSource,
    assert_openai_error,
    fast_settings,
    route,
    running_gateway,
    serving,
)

COMPLETION = {
    "object": "text_completion",
    "choices": [{"index": 0, "text": "hi", "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


@dataclass
class Engine:
    """An upstream that counts every request on the OpenAI paths and answers after `delay_s`
    (the gateway's scrapes of its /metrics are not requests)."""

    delay_s: float = 0.0
    seen: list[str] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        if request.path.startswith("/v1/"):
            self.seen.append(request.path)
        await asyncio.sleep(self.delay_s)
        return web.json_response(COMPLETION)


@asynccontextmanager
async def engine(delay_s: float = 0.0) -> AsyncIterator[Engine]:
    upstream = Engine(delay_s)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", upstream.handle)
    async with serving(app) as url:
        upstream.url = url
        yield upstream


async def test_twenty_thousand_prompts_get_400_and_never_reach_the_engine(store: Store) -> None:
    async with (
        engine() as upstream,
        running_gateway(store, FakeRouteSource(route("smol-0", upstream.url))) as gw,
    ):
        body = {"model": MODEL, "prompt": [[0]] * 20_000, "max_tokens": 1}
        refused = await gw.client.post("/v1/completions", json=body, headers=gw.auth)
        assert_openai_error(refused, 400, "max_prompts_per_request_exceeded")
        assert "max_prompts_per_request" in refused.json()["error"]["message"]
        assert refused.json()["error"]["param"] == "prompt"
        assert upstream.seen == []
        # The same client, within the limit, is served.
        body["prompt"] = [[0]] * 8
        served = await gw.client.post("/v1/completions", json=body, headers=gw.auth)
        assert served.status_code == 200, served.text
        assert upstream.seen == ["/v1/completions"]


async def test_a_keys_own_limit_replaces_the_gateway_default(store: Store) -> None:
    settings = fast_settings(max_prompts_per_request=4)
    async with (
        engine() as upstream,
        running_gateway(store, FakeRouteSource(route("smol-0", upstream.url)), settings) as gw,
    ):
        body = {"model": MODEL, "prompt": ["hi"] * 6, "max_tokens": 1}
        before = await gw.client.post("/v1/completions", json=body, headers=gw.auth)
        assert_openai_error(before, 400, "max_prompts_per_request_exceeded")
        await store.set_key_limits(gw.key_id, KeyLimits(max_prompts_per_request=8))
        deadline = time.monotonic() + 5
        while True:  # the gateway re-reads its keys every 0.1 s in these settings
            after = await gw.client.post("/v1/completions", json=body, headers=gw.auth)
            if after.status_code == 200 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        assert after.status_code == 200, after.text
        assert upstream.seen == ["/v1/completions"]


async def test_without_the_fair_queue_when_every_replica_is_full_the_next_request_gets_429(
    store: Store,
) -> None:
    settings = fast_settings(max_inflight_per_replica=1, fair_queue=False)
    async with engine(delay_s=1.0) as first, engine(delay_s=1.0) as second:
        source = FakeRouteSource(route("smol-0", first.url), route("smol-1", second.url))
        async with running_gateway(store, source, settings) as gw:
            held = [asyncio.create_task(gw.chat(max_tokens=1)) for _ in range(2)]
            deadline = time.monotonic() + 5
            while len(first.seen) + len(second.seen) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            # One request on each replica: the bound sent the second to the free one.
            assert (len(first.seen), len(second.seen)) == (1, 1)

            busy = await gw.chat(max_tokens=1)
            assert_openai_error(busy, 429, "replicas_busy")
            assert int(busy.headers["Retry-After"]) >= 1
            assert "max_inflight_per_replica" in busy.json()["error"]["message"]
            assert len(first.seen) + len(second.seen) == 2, "no engine got the extra request"

            assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200]
            # Once they finished, there is room again.
            assert (await gw.chat(max_tokens=1)).status_code == 200


async def test_a_key_over_its_prompt_tokens_in_flight_waits_with_429(store: Store) -> None:
    settings = fast_settings(max_inflight_prompt_tokens=2_000, max_prompt_tokens_per_request=2_000)
    async with engine(delay_s=1.0) as upstream:
        source = FakeRouteSource(route("smol-0", upstream.url))
        async with running_gateway(store, source, settings) as gw:
            words = "x" * 1_500
            first = asyncio.create_task(gw.chat(messages=[{"role": "user", "content": words}]))
            deadline = time.monotonic() + 5
            while not upstream.seen and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            second = await gw.chat(messages=[{"role": "user", "content": words}])
            assert_openai_error(second, 429, "max_inflight_prompt_tokens_exceeded")
            assert int(second.headers["Retry-After"]) >= 1
            assert (await first).status_code == 200
            assert len(upstream.seen) == 1, "the refused request reached the engine"
            # Its tokens were released with its answer: the same request passes now.
            third = await gw.chat(messages=[{"role": "user", "content": words}])
            assert third.status_code == 200
