"""The proxied routes' behaviour at full depth, as a client sees it over real sockets: retries
before the first byte and never after, a client leaving cancels the engine's work and is billed,
external endpoints with their own key, quotas, lockout, adapters, embeddings and /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from gateway.prompt_estimate import estimate_prompt_tokens
from gateway.server import serve
from gateway.settings import GatewaySettings
from store import KeyLimits, Store
from tests.gateway_kit import (
    MODEL,
    FakeRouteSource,
    Gateway,
    assert_openai_error,
    fast_settings,
    recording_standin,
    route,
    running_gateway,
    serving,
    sse_events,
)
from tests.ports import free_port
from workflows.contracts import ReplicaState, Route, RoutingTable

MESSAGES = [{"role": "user", "content": "tell me about otters"}]


def completion(prompt: int = 4, completion_tokens: int = 2) -> dict[str, Any]:
    return {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt + completion_tokens,
        },
    }


def chunk(content: str) -> bytes:
    data = {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": content}}],
    }
    return b"data: " + json.dumps(data).encode() + b"\n\n"


@dataclass
class Scripted:
    """An upstream whose every answer a test chooses; it notes what reached it and when its
    client went away."""

    status: int = 200
    delay_s: float = 0.0
    chunks: int = 0  # > 0: stream this many chunks, one every `chunk_every_s`
    chunk_every_s: float = 0.1
    drop_after: int | None = None  # stop streaming without [DONE] after this many chunks
    calls: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    client_gone_at: float | None = None
    url: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        self.bodies.append(await request.json())
        self.headers.append(dict(request.headers))
        if self.status != 200:
            return web.json_response({"error": {"message": "busy"}}, status=self.status)
        if not self.chunks or not self.bodies[-1].get("stream"):
            await self._wait(request, self.delay_s)
            return web.json_response(completion())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(self.chunks):
            if self.drop_after is not None and i == self.drop_after:
                assert request.transport is not None
                request.transport.close()
                return response
            try:
                await response.write(chunk(f"t{i} "))
            except ConnectionError:
                break
            if not await self._wait(request, self.chunk_every_s):
                return response
        else:
            usage = {"choices": [], "usage": completion(4, self.chunks)["usage"]}
            await response.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
        return response

    async def _wait(self, request: web.Request, seconds: float) -> bool:
        """Sleep, noticing a client that left (as an engine notices and aborts)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if request.transport is None or request.transport.is_closing():
                self.client_gone_at = self.client_gone_at or time.monotonic()
                return False
            await asyncio.sleep(0.02)
        return True


@asynccontextmanager
async def scripted(**script: Any) -> AsyncIterator[Scripted]:
    upstream = Scripted(**script)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", upstream.handle)
    app.router.add_post("/v1/completions", upstream.handle)
    async with serving(app) as url:
        upstream.url = url
        yield upstream


async def metric(gw: Gateway, name: str, **labels: str) -> float:
    """One sample's value from the gateway's /metrics (0 when absent)."""
    text = (await gw.client.get("/metrics")).text
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# --- retries -------------------------------------------------------------------------------


async def test_a_replica_answering_503_before_any_byte_is_retried_on_another(store: Store) -> None:
    async with scripted(status=503) as busy, scripted() as fine:
        source = FakeRouteSource(route("smol-0", busy.url), route("smol-1", fine.url))
        async with running_gateway(store, source) as gw:
            for _ in range(4):
                response = await gw.chat()
                assert response.status_code == 200, response.text
            assert fine.calls == 4
            assert await metric(gw, "llmgw_retries_total", model=MODEL) >= 1
            assert await metric(gw, "llmgw_upstream_errors_total", reason="status_503") >= 1


async def test_a_stream_that_broke_after_its_first_byte_is_never_retried(store: Store) -> None:
    async with (
        scripted(chunks=5, chunk_every_s=0.01, drop_after=2) as breaking,
        scripted(chunks=5) as other,
    ):
        source = FakeRouteSource(route("smol-0", breaking.url), route("smol-1", other.url))
        async with running_gateway(store, source) as gw:
            # Prefer the breaking replica: least load ties go round robin, so send until it
            # has had one.
            while breaking.calls == 0:
                async with gw.client.stream(
                    "POST",
                    "/v1/chat/completions",
                    json={"model": MODEL, "messages": MESSAGES, "stream": True},
                    headers=gw.auth,
                ) as response:
                    events = await sse_events(response)
            calls_elsewhere = other.calls
            assert json.loads(events[-2])["error"]["code"] == "upstream_stream_error"
            assert events[-1] == "[DONE]"
            assert [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:2]] == [
                "t0 ",
                "t1 ",
            ]
            await asyncio.sleep(0.2)
            assert other.calls == calls_elsewhere, "the broken stream went nowhere else"


async def test_retries_stop_at_the_clients_deadline(store: Store) -> None:
    async with scripted(delay_s=5) as hung, scripted(delay_s=5) as also_hung:
        source = FakeRouteSource(route("smol-0", hung.url), route("smol-1", also_hung.url))
        async with running_gateway(store, source) as gw:
            started = time.monotonic()
            response = await gw.client.post(
                "/v1/chat/completions",
                json={"model": MODEL, "messages": MESSAGES},
                headers={**gw.auth, "X-Stainless-Timeout": "1"},
            )
            took = time.monotonic() - started
    assert_openai_error(response, 504, "upstream_timeout")
    assert took < 3, f"answered after {took:.1f}s, past the client's 1s deadline"
    assert hung.calls + also_hung.calls == 1, "no time was left to try the second replica"


async def test_a_dead_replica_is_ejected_and_later_probed(store: Store) -> None:
    dead = route("smol-0", "http://127.0.0.1:9")  # discard port: nothing listens
    async with scripted() as fine:
        source = FakeRouteSource(dead, route("smol-1", fine.url))
        async with running_gateway(store, source) as gw:
            for _ in range(10):
                assert (await gw.chat()).status_code == 200
            unreachable = await metric(gw, "llmgw_upstream_errors_total", reason="unreachable")
    # Three failures open the breaker; after that requests go straight to the live replica.
    assert 1 <= unreachable <= 3
    assert fine.calls == 10


# --- a client that leaves -------------------------------------------------------------------


async def test_a_client_leaving_mid_stream_cancels_the_engine_and_is_billed(
    store: Store,
) -> None:
    async with (
        scripted(chunks=200, chunk_every_s=0.05) as slow,
        running_gateway(store, FakeRouteSource(route("smol-0", slow.url))) as gw,
    ):
        seen = 0
        async with gw.client.stream(
            "POST",
            "/v1/chat/completions",
            json={"model": MODEL, "messages": MESSAGES, "stream": True},
            headers=gw.auth,
        ) as response:
            async for line in response.aiter_lines():
                seen += line.startswith("data: ")
                if seen == 3:
                    left_at = time.monotonic()
                    break
        deadline = time.monotonic() + 3
        while slow.client_gone_at is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert slow.client_gone_at is not None, "the engine kept generating"
        assert slow.client_gone_at - left_at < 2
        prompt, completion_tokens = await gw.usage_totals(expect_requests=1)
    assert completion_tokens >= 3, "what was produced is billed"
    assert prompt > 0


async def test_a_client_leaving_a_plain_request_cancels_the_engine(store: Store) -> None:
    async with (
        scripted(delay_s=10) as slow,
        running_gateway(store, FakeRouteSource(route("smol-0", slow.url))) as gw,
    ):
        with pytest.raises(httpx.ReadTimeout):
            await gw.client.post(
                "/v1/chat/completions",
                json={"model": MODEL, "messages": MESSAGES},
                headers=gw.auth,
                timeout=0.5,
            )
        left_at = time.monotonic()
        deadline = left_at + 3
        while slow.client_gone_at is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert slow.client_gone_at is not None
        assert slow.client_gone_at - left_at < 2
        await gw.usage_totals(expect_requests=1)


# --- external endpoints ---------------------------------------------------------------------


def external(replica_id: str, url: str, model: str = MODEL, upstream_model: str = "") -> Route:
    return Route(
        replica_id=replica_id,
        model=model,
        node="external",
        endpoint=url,
        engine="external",
        state=ReplicaState.READY,
        upstream_model=upstream_model,
    )


async def test_a_new_external_model_carries_its_key_from_its_first_request(store: Store) -> None:
    # The keys' own round is slowed to a minute: only the routing table's change can bring the
    # key in time, as it must when `llmgw model add` stores the key and then adds the model.
    async with scripted() as keyed:
        source = FakeRouteSource()
        settings = fast_settings(key_refresh_interval_s=60)
        async with running_gateway(store, source, settings) as gw:
            await store.set_upstream_key(MODEL, "sk-stored-first")
            fetched = source.fetches
            source.table = RoutingTable(version=2, routes=[external(f"{MODEL}/ext-0", keyed.url)])
            while source.fetches < fetched + 2:  # the new table is in, and was acted on
                await asyncio.sleep(0.01)
            assert (await gw.chat()).status_code == 200
    assert keyed.headers[0]["Authorization"] == "Bearer sk-stored-first"


async def test_an_external_endpoint_is_sent_the_name_it_knows_the_model_by(store: Store) -> None:
    async with scripted(chunks=2) as renamed, scripted() as same_name:
        source = FakeRouteSource(
            external(f"{MODEL}/ext-0", renamed.url, upstream_model="org/Hosted-8B:latest"),
            external("other/ext-0", same_name.url, model="other"),
        )
        async with running_gateway(store, source) as gw:
            assert (await gw.chat()).status_code == 200
            assert (await gw.chat(stream=True)).status_code == 200
            assert (await gw.chat(model="other")).status_code == 200
            models = (await gw.client.get("/v1/models", headers=gw.auth)).json()
    assert [b["model"] for b in renamed.bodies] == ["org/Hosted-8B:latest"] * 2
    assert same_name.bodies[0]["model"] == "other"
    # Clients still see and ask for llmgw's name.
    assert {m["id"] for m in models["data"]} == {MODEL, "other"}


async def test_an_external_endpoint_gets_its_own_key_and_no_engine_key(store: Store) -> None:
    await store.set_upstream_key(MODEL, "sk-upstream-secret")
    async with scripted() as keyed, scripted() as open_endpoint:
        source = FakeRouteSource(
            external(f"{MODEL}/ext-0", keyed.url + "/v1"),
            external("other/ext-0", open_endpoint.url, model="other"),
        )
        async with running_gateway(store, source) as gw:
            assert (await gw.chat()).status_code == 200
            assert (await gw.chat(model="other")).status_code == 200
            await gw.usage_totals(expect_requests=2)
    assert keyed.headers[0]["Authorization"] == "Bearer sk-upstream-secret"
    assert "Authorization" not in open_endpoint.headers[0]
    assert gw.api_key not in json.dumps(keyed.headers + open_endpoint.headers)


# --- keys: adapters, quotas, lockout ---------------------------------------------------------


def lora_route(replica_id: str, url: str, engine: str, adapters: list[str]) -> Route:
    return route(replica_id, url).model_copy(update={"engine": engine, "adapters": adapters})


async def test_adapters_are_allowlisted_and_sent_by_name_to_vllm(store: Store) -> None:
    _, plaintext = await store.create_key("lora-user", adapters=["sql"])
    async with (
        scripted() as upstream,
        running_gateway(
            store, FakeRouteSource(lora_route("smol-0", upstream.url, "vllm", ["sql"]))
        ) as gw,
    ):
        headers = {"Authorization": f"Bearer {plaintext}"}
        body = {"model": f"{MODEL}:sql", "messages": MESSAGES}
        allowed = await gw.client.post("/v1/chat/completions", json=body, headers=headers)
        body["model"] = f"{MODEL}:other"
        refused = await gw.client.post("/v1/chat/completions", json=body, headers=headers)
    assert allowed.status_code == 200
    assert upstream.bodies[0]["model"] == "sql"
    assert "lora" not in upstream.bodies[0]
    assert_openai_error(refused, 403, "adapter_not_allowed")
    assert upstream.calls == 1


async def test_llamacpp_gets_the_adapter_by_its_launch_index(store: Store) -> None:
    """llama-server applies an adapter only when the request's `lora` field lists its index
    (the order of its --lora flags); a replica that did not load it is never chosen."""
    async with (
        scripted() as loaded,
        scripted() as bare,
        running_gateway(
            store,
            FakeRouteSource(
                lora_route("smol-0", loaded.url, "llamacpp", ["sql", "chat"]),
                lora_route("smol-1", bare.url, "llamacpp", []),
            ),
        ) as gw,
    ):
        for _ in range(4):
            assert (await gw.chat(model=f"{MODEL}:chat")).status_code == 200
        assert (await gw.chat(model=f"{MODEL}:sql")).status_code == 200
        plain = await gw.chat()
        unknown = await gw.chat(model=f"{MODEL}:nope")
        own_lora = await gw.chat(lora=[{"id": 0, "scale": 1.0}])
    assert plain.status_code == 200
    assert loaded.calls + bare.calls == 6
    adapted = [b for b in loaded.bodies if "lora" in b]
    assert [b["lora"] for b in adapted] == [[{"id": 1, "scale": 1.0}]] * 4 + [
        [{"id": 0, "scale": 1.0}]
    ]
    assert {b["model"] for b in adapted} == {f"{MODEL}:chat", f"{MODEL}:sql"}
    assert all("lora" not in b for b in bare.bodies)
    # The plain request: on the replica loading adapters, each one at scale 0.
    base = [b for b in loaded.bodies if b["model"] == MODEL]
    assert all(b["lora"] == [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}] for b in base)
    assert_openai_error(unknown, 404, "adapter_not_found")
    assert "nope" in unknown.json()["error"]["message"]
    assert_openai_error(own_lora, 400)  # a client's own `lora` would bypass the allowlist


async def test_models_lists_each_adapter_the_key_may_use(store: Store) -> None:
    _, plaintext = await store.create_key("lora-list", adapters=["sql"])
    source = FakeRouteSource(
        lora_route("smol-0", "http://127.0.0.1:1", "llamacpp", ["sql", "chat"]),
        lora_route("smol-1", "http://127.0.0.1:1", "llamacpp", ["sql"]),
    )
    async with running_gateway(store, source) as gw:
        every = (await gw.client.get("/v1/models", headers=gw.auth)).json()["data"]
        limited = (
            await gw.client.get("/v1/models", headers={"Authorization": f"Bearer {plaintext}"})
        ).json()["data"]
    ready = {m["id"]: m["ready_replicas"] for m in every}
    assert ready == {MODEL: 2, f"{MODEL}:sql": 2, f"{MODEL}:chat": 1}
    assert [m["id"] for m in limited] == [MODEL, f"{MODEL}:sql"]


async def test_50_concurrent_requests_with_budget_for_5_admit_at_most_5(store: Store) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 10}
    per_request = estimate_prompt_tokens(body) + 10
    budget = 5 * per_request
    record, plaintext = await store.create_key(
        f"budget-{uuid.uuid4().hex[:6]}", limits=KeyLimits(token_budget=budget)
    )
    async with (
        scripted(delay_s=0.5) as upstream,
        running_gateway(store, FakeRouteSource(route("smol-0", upstream.url))) as gw,
    ):
        headers = {"Authorization": f"Bearer {plaintext}"}
        responses = await asyncio.gather(
            *(gw.client.post("/v1/chat/completions", json=body, headers=headers) for _ in range(50))
        )
        admitted = [r for r in responses if r.status_code == 200]
        refused = [r for r in responses if r.status_code == 429]
        assert len(admitted) + len(refused) == 50
        assert len(admitted) <= 5
        assert len(admitted) >= 1
        for response in refused:
            assert response.json()["error"]["code"] == "quota_budget"
        assert await metric(gw, "llmgw_quota_rejections_total", reason="budget") == len(refused)
        # Every admitted request reported 4 + 2 tokens: the spend is exactly that.
        deadline = time.monotonic() + 5
        while True:
            rows = await store.usage(key_id=record.key_id)
            spent = sum(r.prompt_tokens + r.completion_tokens for r in rows)
            if sum(r.requests for r in rows) >= len(admitted) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
    assert spent == 6 * len(admitted)
    assert spent <= budget
    assert upstream.calls == len(admitted)


async def test_requests_per_minute_are_limited_with_retry_after(store: Store) -> None:
    _, plaintext = await store.create_key("rpm-3", limits=KeyLimits(rpm=3))
    async with (
        scripted() as upstream,
        running_gateway(store, FakeRouteSource(route("smol-0", upstream.url))) as gw,
    ):
        headers = {"Authorization": f"Bearer {plaintext}"}
        statuses = []
        for _ in range(4):
            response = await gw.client.post(
                "/v1/chat/completions",
                json={"model": MODEL, "messages": MESSAGES},
                headers=headers,
            )
            statuses.append(response.status_code)
    assert statuses == [200, 200, 200, 429]
    assert_openai_error(response, 429, "quota_rpm")
    assert 1 <= int(response.headers["Retry-After"]) <= 60


async def test_a_budget_key_without_max_tokens_is_clamped_to_what_is_left(store: Store) -> None:
    body = {"model": MODEL, "messages": MESSAGES}
    budget = estimate_prompt_tokens(body) + 7
    _, plaintext = await store.create_key("tiny", limits=KeyLimits(token_budget=budget))
    async with (
        scripted() as upstream,
        running_gateway(store, FakeRouteSource(route("smol-0", upstream.url))) as gw,
    ):
        response = await gw.client.post(
            "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {plaintext}"}
        )
    assert response.status_code == 200
    assert upstream.bodies[0]["max_tokens"] == 7


async def test_repeated_bad_keys_lock_out_that_address_only(store: Store) -> None:
    async with scripted() as upstream:
        settings = fast_settings(auth_failures_before_lockout=3, auth_lockout_s=30)
        async with running_gateway(
            store, FakeRouteSource(route("smol-0", upstream.url)), settings
        ) as gw:
            bad = {"Authorization": "Bearer llmgw-0badc0de-" + "a" * 43}
            body = {"model": MODEL, "messages": MESSAGES}
            statuses = [
                (await gw.client.post("/v1/chat/completions", json=body, headers=bad)).status_code
                for _ in range(4)
            ]
            locked = await gw.client.post("/v1/chat/completions", json=body, headers=gw.auth)
            transport = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
            async with httpx.AsyncClient(
                base_url=gw.url, transport=transport, trust_env=False
            ) as elsewhere:
                other = await elsewhere.post("/v1/chat/completions", json=body, headers=gw.auth)
    assert statuses == [401, 401, 401, 429]
    assert_openai_error(locked, 429, "too_many_auth_failures")
    assert 1 <= int(locked.headers["Retry-After"]) <= 30
    assert other.status_code == 200, "another client is not locked out"


# --- embeddings, usage, metrics ---------------------------------------------------------------


async def test_embeddings_are_relayed_and_metered(store: Store, tmp_path: Path) -> None:
    async with (
        recording_standin(tmp_path) as upstream,
        running_gateway(store, FakeRouteSource(route("smol-0", upstream.url))) as gw,
    ):
        response = await gw.client.post(
            "/v1/embeddings", json={"model": MODEL, "input": ["a", "b"]}, headers=gw.auth
        )
        assert response.status_code == 200, response.text
        assert len(response.json()["data"]) == 2
        prompt, completion_tokens = await gw.usage_totals(expect_requests=1)
    assert (prompt, completion_tokens) == (2, 0)
    assert upstream.seen[-1][1] == "/v1/embeddings"


async def test_metrics_count_requests_tokens_ttft_and_routing(store: Store) -> None:
    async with (
        scripted(chunks=3, chunk_every_s=0.01) as upstream,
        running_gateway(store, FakeRouteSource(route("smol-0", upstream.url))) as gw,
    ):
        assert (await gw.chat()).status_code == 200
        async with gw.client.stream(
            "POST",
            "/v1/chat/completions",
            json={"model": MODEL, "messages": MESSAGES, "stream": True},
            headers=gw.auth,
        ) as response:
            await sse_events(response)
        await gw.usage_totals(expect_requests=2)
        ok = await metric(
            gw,
            "llmgw_requests_total",
            model=MODEL,
            endpoint="/v1/chat/completions",
            status="200",
        )
        ttft = await metric(gw, "llmgw_time_to_first_token_seconds_count", model=MODEL)
        completion_tokens = await metric(gw, "llmgw_tokens_total", kind="completion")
        decisions = await metric(gw, "llmgw_routing_decisions_total", model=MODEL)
        unknown = await gw.chat(model=f"nope-{uuid.uuid4().hex}")
        labelled = (await gw.client.get("/metrics")).text
    assert ok == 2
    assert ttft == 1
    assert completion_tokens == 2 + 3
    assert decisions >= 2
    assert unknown.status_code == 404
    assert "nope-" not in labelled, "unknown model names never become metric labels"


# --- the gateway as `llmgw gateway` serves it -----------------------------------------------------


@asynccontextmanager
async def served(
    settings: GatewaySettings, store: Store, source: FakeRouteSource
) -> AsyncIterator[httpx.AsyncClient]:
    """`serve` running as a task until the block ends, then cancelled, as a program embedding
    the gateway would stop it."""
    task = asyncio.create_task(serve(settings, store, source))
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=5) as http:
            deadline = time.monotonic() + 10
            while True:
                try:
                    await http.get(f"http://127.0.0.1:{settings.port}/healthz")
                    break
                except httpx.ConnectError:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
            yield http
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_cancelled_gateway_writes_the_usage_it_counted(
    store: Store, tmp_path: Path
) -> None:
    # Usage is flushed every minute here: only the gateway's own shutdown can write it in time.
    settings = fast_settings(
        host="127.0.0.1", port=free_port(), admin_port=free_port(), usage_flush_interval_s=60
    )
    record, plaintext = await store.create_key("cancelled-test")
    async with recording_standin(tmp_path) as upstream:
        source = FakeRouteSource(route("smol-0", upstream.url))
        async with served(settings, store, source) as http:
            response = await http.post(
                f"http://127.0.0.1:{settings.port}/v1/chat/completions",
                json={"model": MODEL, "messages": MESSAGES},
                headers={"Authorization": f"Bearer {plaintext}"},
            )
            assert response.status_code == 200
            assert await store.usage(key_id=record.key_id) == []
    rows = await store.usage(key_id=record.key_id)
    assert [(r.model, r.requests) for r in rows] == [(MODEL, 1)]
    # Nothing of the gateway is left pending in the loop: its lifespan ran to its end.
    assert not [t for t in asyncio.all_tasks() if "LifespanOn.main" in repr(t)]


# --- the admin API's own listener -------------------------------------------------------------


async def test_the_admin_api_answers_only_on_its_loopback_listener(
    store: Store, tmp_path: Path
) -> None:
    port, admin_port = free_port(), free_port()
    settings = fast_settings(host="127.0.0.1", port=port, admin_port=admin_port)
    # Made before the gateway starts, so its first read of the key table has it.
    _, plaintext = await store.create_key("listener-test")
    auth = {"Authorization": f"Bearer {plaintext}"}
    async with recording_standin(tmp_path) as upstream:
        source = FakeRouteSource(route("smol-0", upstream.url))
        async with served(settings, store, source) as http:
            public, admin = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}"
            on_public = await http.get(public + "/admin/v1/routes")
            on_admin = await http.get(admin + "/admin/v1/routes")
            chat_on_admin = await http.post(
                admin + "/v1/chat/completions",
                json={"model": MODEL, "messages": MESSAGES},
                headers=auth,
            )
            chat_on_public = await http.post(
                public + "/v1/chat/completions",
                json={"model": MODEL, "messages": MESSAGES},
                headers=auth,
            )
            metrics_on_admin = await http.get(admin + "/metrics")
            metrics_on_public = await http.get(public + "/metrics")
            health_on_admin = await http.get(admin + "/healthz")
    # Stopped, it leaves no listener registered with the loop for a socket it closed: a
    # descriptor reused later would meet that stale registration (seen as a later test's
    # PostgreSQL connect failing in the shared test loop).
    selector = asyncio.get_running_loop()._selector  # type: ignore[attr-defined]
    for key in list(selector.get_map().values()):
        os.fstat(key.fd)  # raises for a closed descriptor
    assert_openai_error(on_public, 404, "not_found")
    assert on_admin.status_code == 200
    assert on_admin.json()["routes"][0]["replica_id"] == "smol-0"
    assert_openai_error(chat_on_admin, 404, "not_found")
    assert chat_on_public.status_code == 200
    assert metrics_on_admin.status_code == 200
    assert "llmgw_requests_total" in metrics_on_admin.text
    # The metrics name every model: no answer for them where the OpenAI API is served.
    assert_openai_error(metrics_on_public, 404, "not_found")
    assert health_on_admin.status_code == 200


def test_the_admin_api_refuses_to_listen_off_loopback(store: Store) -> None:
    settings = fast_settings(admin_host="0.0.0.0")
    with pytest.raises(RuntimeError, match="loopback only"):
        asyncio.run(serve(settings, store, FakeRouteSource()))
