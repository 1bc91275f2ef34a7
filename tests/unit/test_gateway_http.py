"""The gateway as a client sees it: a real uvicorn server on an ephemeral port, a real SQLite
store, a fake route source, and real upstreams — the llama-server stand-in
(tests/standin_engine.py) in its own process, plus a small in-test upstream that records what
it was sent."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from starlette.requests import Request

from gateway.admin.routes import require_local
from gateway.errors import ApiError
from gateway.server import serve
from gateway.settings import GatewaySettings
from store import Store, open_store
from tests.gateway_kit import (
    MODEL,
    NODE,
    FakeRouteSource,
    Gateway,
    assert_openai_error,
    complete_response,
    fast_settings,
    http_request,
    recording_upstream,
    route,
    running_gateway,
    serving,
    sse_events,
    start_standin,
    stop,
)
from tests.ports import free_port
from workflows.contracts import ReplicaState, RoutingTable
from workflows.engine_keys import engine_key_from_master

HELLO = [{"role": "user", "content": "hi"}]


async def truncated_stream(request: web.Request) -> web.StreamResponse:
    """An engine that closes its stream cleanly but early: no usage, no [DONE]."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    chunk = {"choices": [{"index": 0, "delta": {"content": "half"}, "finish_reason": None}]}
    await response.write(f"data: {json.dumps(chunk)}\r\n\r\n".encode())
    await response.write_eof()
    return response


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gateway")


@pytest.fixture(scope="module")
async def store(state_dir: Path) -> AsyncIterator[Store]:
    store = open_store(None, state_dir)
    await store.init()
    yield store
    await store.close()


@pytest.fixture(scope="module")
async def engine_keys(store: Store) -> dict[str, str]:
    master = await store.master_secret()
    return {rid: engine_key_from_master(master, NODE, rid) for rid in ("smol-0", "smol-1")}


@pytest.fixture(scope="module")
def standin(state_dir: Path, engine_keys: dict[str, str]) -> Iterator[str]:
    url, proc = start_standin(state_dir, list(engine_keys.values()))
    yield url
    stop(proc)


@pytest.fixture
async def gateway(store: Store, standin: str) -> AsyncIterator[Gateway]:
    async with running_gateway(store, FakeRouteSource(route("smol-0", standin))) as gw:
        yield gw


# --- authentication ----------------------------------------------------------------------


async def test_missing_wrong_and_revoked_keys_are_401(gateway: Gateway, store: Store) -> None:
    assert_openai_error(
        await gateway.client.post("/v1/chat/completions", json={"model": MODEL}),
        401,
        "invalid_api_key",
    )
    wrong = gateway.api_key[:-3] + ("abc" if not gateway.api_key.endswith("abc") else "xyz")
    response = await gateway.client.post(
        "/v1/chat/completions", json={"model": MODEL}, headers={"Authorization": f"Bearer {wrong}"}
    )
    assert_openai_error(response, 401, "invalid_api_key")
    assert (await gateway.chat()).status_code == 200
    await store.revoke_key(gateway.key_id)
    # The running gateway picks the revocation up within its key refresh interval.
    deadline = time.monotonic() + 3
    while (response := await gateway.chat()).status_code == 200 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert_openai_error(response, 401, "invalid_api_key")
    assert_openai_error(await gateway.client.get("/v1/models", headers=gateway.auth), 401)


async def test_every_bad_key_gets_the_same_401_and_is_counted_by_reason(
    gateway: Gateway, store: Store
) -> None:
    """Which check failed never shows in the answer: only in the log and the metrics."""
    record, revoked = await store.create_key(f"revoked-{uuid.uuid4().hex[:6]}")
    await store.revoke_key(record.key_id)
    past = datetime.now(UTC) - timedelta(seconds=1)
    _, expired = await store.create_key(f"expired-{uuid.uuid4().hex[:6]}", expires_at=past)
    await _until_refreshed(gateway, store)
    secret_length = 43  # the key format's (store/keyformat.py)
    kinds = {
        "missing_key": {},
        "malformed_key": {"Authorization": "Bearer not-a-key"},
        "unknown_key": {"Authorization": f"Bearer llmgw-0badc0de-{'B' * secret_length}"},
        "wrong_secret": {"Authorization": f"Bearer llmgw-{gateway.key_id}-{'A' * secret_length}"},
        "revoked": {"Authorization": f"Bearer {revoked}"},
        "expired": {"Authorization": f"Bearer {expired}"},
    }
    answers = set()
    for headers in kinds.values():
        for response in (
            await gateway.client.get("/v1/models", headers=headers),
            await gateway.client.post(
                "/v1/chat/completions", json={"model": MODEL, "messages": HELLO}, headers=headers
            ),
        ):
            assert_openai_error(response, 401, "invalid_api_key")
            answers.add((json.dumps(response.json()), response.headers["www-authenticate"]))
    assert len(answers) == 1, answers
    metrics = (await gateway.client.get("/metrics")).text
    for reason in kinds:
        # The /v1/models refusals, at least: every reason shows on its own.
        assert f'llmgw_auth_failures_total{{reason="{reason}"}}' in metrics, reason


async def _until_refreshed(gateway: Gateway, store: Store) -> None:
    """Until the gateway's key refresh (every 0.1 s here) has read every key made so far: a key
    made in the store works from the next refresh, never by a lookup on the request path. A
    copy that holds a key made now was read after it, so it holds every earlier key too."""
    _, sentinel = await store.create_key(f"sentinel-{uuid.uuid4().hex[:6]}")
    deadline = time.monotonic() + 5
    headers = {"Authorization": f"Bearer {sentinel}"}
    while (await gateway.client.get("/v1/models", headers=headers)).status_code == 401:
        assert time.monotonic() < deadline, "the gateway never read the key table"
        await asyncio.sleep(0.02)


async def test_a_key_limited_to_other_models_gets_403(gateway: Gateway, store: Store) -> None:
    _, limited = await store.create_key(f"limited-{uuid.uuid4().hex[:6]}", models=["other"])
    await _until_refreshed(gateway, store)
    response = await gateway.client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": HELLO},
        headers={"Authorization": f"Bearer {limited}"},
    )
    assert_openai_error(response, 403, "model_not_allowed")
    listed = await gateway.client.get("/v1/models", headers={"Authorization": f"Bearer {limited}"})
    assert listed.json()["data"] == []


# --- request validation ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b'{"messages": []}', "model"),
        (b'{"model": 7}', "model"),
        (b'{"model": "smol", "stream": "yes", "messages": [{"content": "hi"}]}', "stream"),
        (b'{"model": "smol", "messages": []}', "messages"),
        (b'{"model": "smol", "max_tokens": 0, "messages": [{"content": "hi"}]}', "max_tokens"),
        (b'{"model": "smol", "n": 1000, "messages": [{"content": "hi"}]}', "n"),
        (
            b'{"model": "smol", "stream": true, "stream_options": 1,'
            b' "messages": [{"content": "x"}]}',
            "stream_options",
        ),
        (b'{"model": "smol", "api_base": "http://169.254.169.254/"}', "api_base"),
        (b'{"model": "smol", "base_url": "http://evil/"}', "base_url"),
        (b'{"model": "smol", "api_key": "sk-other"}', "api_key"),
        (b'{"model": "smol", "headers": {"X-A": "1"}}', "headers"),
    ],
)
async def test_bad_bodies_are_400_naming_the_field(
    gateway: Gateway, body: bytes, param: str | None
) -> None:
    response = await gateway.client.post(
        "/v1/chat/completions",
        content=body,
        headers={**gateway.auth, "Content-Type": "application/json"},
    )
    assert_openai_error(response, 400)
    assert response.json()["error"]["param"] == param


async def test_an_oversized_body_is_refused(store: Store, standin: str) -> None:
    source = FakeRouteSource(route("smol-0", standin))
    async with running_gateway(store, source, fast_settings(max_body_bytes=1024)) as gw:
        response = await gw.chat(messages=[{"role": "user", "content": "x" * 4096}])
        assert_openai_error(response, 413, "request_too_large")


# --- routing outcomes --------------------------------------------------------------------


async def test_unknown_model_is_404(gateway: Gateway) -> None:
    assert_openai_error(await gateway.chat(model="nope"), 404, "model_not_found")


class UnreachableLedger(FakeRouteSource):
    async def fetch(self) -> RoutingTable:
        self.fetches += 1
        raise ConnectionError("Temporal is not up yet")


async def test_before_the_first_routing_table_every_model_is_503_not_404(store: Store) -> None:
    async with running_gateway(store, UnreachableLedger()) as gw:
        response = await gw.chat(model="anything")
        assert_openai_error(response, 503, "routes_not_loaded")
        assert response.headers["retry-after"] == "2"


async def test_model_without_a_ready_replica_is_503_with_retry_after(store: Store) -> None:
    source = FakeRouteSource(route("smol-0", "http://127.0.0.1:1", ReplicaState.LOADING))
    async with running_gateway(store, source) as gw:
        response = await gw.chat()
        assert_openai_error(response, 503, "no_ready_replica")
        assert response.headers["retry-after"] == "2"
        models = (await gw.client.get("/v1/models", headers=gw.auth)).json()["data"]
        assert [(m["id"], m["ready_replicas"]) for m in models] == [(MODEL, 0)]


async def test_unreachable_replica_fails_over_to_another(store: Store, standin: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    # smol-0 sorts first, so the first pick is the dead one.
    source = FakeRouteSource(route("smol-0", dead), route("smol-1", standin))
    async with running_gateway(store, source) as gw:
        for _ in range(3):
            response = await gw.chat()
            assert response.status_code == 200, response.text


async def test_no_reachable_replica_is_502(store: Store) -> None:
    source = FakeRouteSource(
        route("smol-0", f"http://127.0.0.1:{free_port()}"),
        route("smol-1", f"http://127.0.0.1:{free_port()}"),
    )
    async with running_gateway(store, source) as gw:
        assert_openai_error(await gw.chat(), 502, "upstream_unreachable")


async def test_requests_never_wait_on_the_route_source(store: Store, standin: str) -> None:
    source = FakeRouteSource(route("smol-0", standin))
    async with running_gateway(store, source, fast_settings(refresh_interval_s=10)) as gw:
        before = source.fetches
        for _ in range(5):
            assert (await gw.chat()).status_code == 200
        assert source.fetches == before


async def test_route_changes_reach_the_gateway_without_restart(store: Store, standin: str) -> None:
    source = FakeRouteSource(route("smol-0", standin, ReplicaState.STARTING))
    async with running_gateway(store, source) as gw:
        assert (await gw.chat()).status_code == 503
        source.table = RoutingTable(version=2, routes=[route("smol-0", standin)])
        deadline = time.monotonic() + 3
        while (response := await gw.chat()).status_code == 503 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert response.status_code == 200


# --- relaying ----------------------------------------------------------------------------


async def test_upstream_sees_the_engine_key_never_the_clients(
    store: Store, engine_keys: dict[str, str]
) -> None:
    async with recording_upstream() as upstream:
        source = FakeRouteSource(route("smol-0", upstream.url))
        async with running_gateway(store, source) as gw:
            response = await gw.client.post(
                "/v1/chat/completions",
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "hi"}],
                    "temperature": 0.5,
                },
                headers={**gw.auth, "X-Secret-Header": "client-only", "Cookie": "a=b"},
            )
            assert response.status_code == 200
            assert response.json()["choices"][0]["message"]["content"] == "hi"
            client_key = gw.api_key
    ((headers, body),) = upstream.seen
    assert headers["Authorization"] == f"Bearer {engine_keys['smol-0']}"
    assert all(client_key not in value for value in headers.values())
    assert "X-Secret-Header" not in headers
    assert "Cookie" not in headers
    assert body == {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.5,
    }


async def test_plain_chat_is_relayed_and_usage_recorded(gateway: Gateway) -> None:
    response = await gateway.chat(messages=[{"role": "user", "content": "one two three"}])
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["choices"][0]["message"]["content"] == "echo: one two three"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert await gateway.usage_totals(expect_requests=1) == (3, 4)


async def test_text_completions_are_relayed(gateway: Gateway) -> None:
    response = await gateway.client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "a b"}, headers=gateway.auth
    )
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] == "echo: a b"


async def test_stream_is_relayed_without_the_usage_chunk_it_did_not_ask_for(
    gateway: Gateway,
) -> None:
    body = {
        "model": MODEL,
        "stream": True,
        "messages": [{"role": "user", "content": "one two three"}],
    }
    async with gateway.client.stream(
        "POST", "/v1/chat/completions", json=body, headers=gateway.auth
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = await sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == "echo: one two three"
    assert all("usage" not in c for c in chunks)
    # The gateway asked the engine for usage anyway, so the request is accounted in full.
    assert await gateway.usage_totals(expect_requests=1) == (3, 4)


async def test_stream_keeps_the_usage_chunk_when_asked(gateway: Gateway) -> None:
    body = {
        "model": MODEL,
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "a b"}],
    }
    async with gateway.client.stream(
        "POST", "/v1/chat/completions", json=body, headers=gateway.auth
    ) as response:
        events = await sse_events(response)
    usage_chunk = json.loads(events[-2])
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 3
    assert await gateway.usage_totals(expect_requests=1) == (2, 3)


async def test_an_engine_dying_mid_stream_ends_the_stream_with_an_error(
    store: Store, engine_keys: dict[str, str], tmp_path: Path
) -> None:
    url, proc = start_standin(
        tmp_path, list(engine_keys.values()), {"STANDIN_DIE_AFTER_CHUNKS": "3"}
    )
    try:
        async with running_gateway(store, FakeRouteSource(route("smol-0", url))) as gw:
            body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "a"}]}
            async with gw.client.stream(
                "POST", "/v1/chat/completions", json=body, headers=gw.auth
            ) as response:
                assert response.status_code == 200
                events = await asyncio.wait_for(sse_events(response), 10)
            assert events[-1] == "[DONE]"
            error = json.loads(events[-2])["error"]
            assert error["code"] == "upstream_stream_error"
            assert len(events) == 5, "three relayed chunks, the error, [DONE]"
            # What did get through is still accounted.
            assert (await gw.usage_totals(expect_requests=1))[1] >= 1
    finally:
        stop(proc)


async def test_an_engine_killed_mid_stream_reaches_the_client_at_once(
    store: Store, engine_keys: dict[str, str], tmp_path: Path
) -> None:
    # The engine's process dies: its connection closes at once, and so must the stream the
    # client sees. A hostile client saw the error event 2.5 s after a kill on a live instance;
    # through the stand-in (its exit closes the connection) it arrives within milliseconds.
    url, proc = start_standin(
        tmp_path, list(engine_keys.values()), {"STANDIN_DIE_AFTER_CHUNKS": "3"}
    )
    try:
        async with running_gateway(store, FakeRouteSource(route("smol-0", url))) as gw:
            body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "a"}]}
            arrivals: list[tuple[float, str]] = []
            async with gw.client.stream(
                "POST", "/v1/chat/completions", json=body, headers=gw.auth
            ) as response:
                async for line in response.aiter_lines():
                    if line:
                        arrivals.append((time.perf_counter(), line))
            assert "upstream_stream_error" in arrivals[-2][1]
            last_chunk_at, error_at = arrivals[2][0], arrivals[-2][0]
            assert error_at - last_chunk_at < 0.5, f"{error_at - last_chunk_at:.2f} s"
    finally:
        stop(proc)


async def test_a_stream_cut_short_without_done_ends_with_an_error(store: Store) -> None:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", truncated_stream)
    async with (
        serving(app) as url,
        running_gateway(store, FakeRouteSource(route("smol-0", url))) as gw,
    ):
        body = {"model": MODEL, "stream": True, "messages": HELLO}
        async with gw.client.stream(
            "POST", "/v1/chat/completions", json=body, headers=gw.auth
        ) as response:
            events = await sse_events(response)
    assert json.loads(events[0])["choices"][0]["delta"]["content"] == "half"
    assert json.loads(events[1])["error"]["code"] == "upstream_stream_error"
    assert events[2:] == ["[DONE]"]


async def test_a_client_leaving_mid_stream_frees_the_replica(
    store: Store, engine_keys: dict[str, str], tmp_path: Path
) -> None:
    url, proc = start_standin(
        tmp_path, list(engine_keys.values()), {"STANDIN_TOKEN_DELAY_S": "0.2"}
    )
    try:
        async with running_gateway(store, FakeRouteSource(route("smol-0", url))) as gw:
            body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "a"}]}
            async with gw.client.stream(
                "POST", "/v1/chat/completions", json=body, headers=gw.auth
            ) as response:
                assert response.status_code == 200
                # Held in a variable: a dropped line iterator is closed by the garbage
                # collector, which would hang up early.
                lines = response.aiter_lines()
                assert (await anext(lines)).startswith("data: ")
                inflight = (await gw.client.get("/admin/v1/routes")).json()["inflight"]
                assert inflight == {"smol-0": 1}
            # Least-loaded routing would shun this replica forever if the slot leaked.
            deadline = time.monotonic() + 3
            while (await gw.client.get("/admin/v1/routes")).json()["inflight"]:
                assert time.monotonic() < deadline, "in-flight count never went back to 0"
                await asyncio.sleep(0.05)
            assert (await gw.usage_totals(expect_requests=1))[1] >= 1
    finally:
        stop(proc)


async def test_usage_is_written_at_shutdown(store: Store, standin: str) -> None:
    source = FakeRouteSource(route("smol-0", standin))
    settings = fast_settings(usage_flush_interval_s=60)
    async with running_gateway(store, source, settings) as gw:
        assert (await gw.chat()).status_code == 200
        assert await store.usage(key_id=gw.key_id) == []
    (row,) = await store.usage(key_id=gw.key_id)
    assert row.requests == 1
    assert row.completion_tokens > 0


class UnreachableStore:
    async def init(self) -> None:
        raise ConnectionError("no database")


async def test_serve_reports_a_failed_start_as_an_error() -> None:
    settings = GatewaySettings(port=free_port())
    with pytest.raises(RuntimeError, match="failed to start"):
        await serve(settings, UnreachableStore(), FakeRouteSource())  # type: ignore[arg-type]


# --- the rest of the surface -------------------------------------------------------------


async def test_unknown_paths_and_methods_get_openai_shaped_errors(gateway: Gateway) -> None:
    assert_openai_error(await gateway.client.get("/nope"), 404)
    assert_openai_error(await gateway.client.get("/v1/chat/completions"), 405)


async def test_an_internal_failure_is_a_plain_500(
    gateway: Gateway, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("db password is hunter2")

    monkeypatch.setattr(store, "usage", broken)
    response = await gateway.client.get("/admin/v1/usage")
    assert_openai_error(response, 500, "internal_error")
    assert response.headers["x-request-id"] in response.json()["error"]["message"]
    assert "hunter2" not in response.text


async def test_healthz(gateway: Gateway) -> None:
    response = await gateway.client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["routes_version"] == 1


async def test_admin_answers_loopback_clients_naming_an_address(gateway: Gateway) -> None:
    await gateway.chat()
    routes = await gateway.client.get("/admin/v1/routes")
    assert routes.status_code == 200
    assert [r["replica_id"] for r in routes.json()["routes"]] == ["smol-0"]
    for host in ("localhost:8080", "[::1]:8080", "127.0.0.1"):
        response = await gateway.client.get("/admin/v1/routes", headers={"Host": host})
        assert response.status_code == 200, host
    # The store holds earlier tests' usage too: wait for this key's own row, flushed a moment
    # after its request.
    deadline = time.monotonic() + 3
    while gateway.key_id not in {
        row["key_id"] for row in (await gateway.client.get("/admin/v1/usage")).json()["data"]
    }:
        assert time.monotonic() < deadline, "the key's usage never showed"
        await asyncio.sleep(0.05)


async def test_admin_refuses_a_host_name_even_from_loopback(gateway: Gateway) -> None:
    # A DNS-rebinding page reaches 127.0.0.1 but still sends its own name as Host.
    for host in ("evil.example.com", "evil.example.com:8080", "127.0.0.1.nip.io"):
        for path in ("/admin/v1/routes", "/admin/v1/usage", "/metrics"):
            response = await gateway.client.get(path, headers={"Host": host})
            assert_openai_error(response, 403, "admin_local_only")


@pytest.mark.parametrize("client", ["10.0.0.7", "192.168.1.2", "2001:db8::1"])
def test_admin_refuses_clients_off_the_machine(client: str) -> None:
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/admin/v1/routes",
        "headers": [(b"host", b"127.0.0.1:8080")],
        "client": (client, 40000),
    }
    with pytest.raises(ApiError) as caught:
        require_local(Request(scope))
    assert caught.value.status == 403


async def test_a_connection_idle_past_a_clients_keepalive_still_carries_a_request(
    gateway: Gateway,
) -> None:
    """The gateway keeps an idle connection longer than httpx (5 s) or aiohttp (15 s) clients do,
    so the client is the one to close it: never a request written onto a closing connection."""
    host, _, port = gateway.url.removeprefix("http://").rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))

    async def healthz() -> bytes:
        writer.write(http_request("GET", "/healthz"))
        data = b""
        while not complete_response(data):
            chunk = await asyncio.wait_for(reader.read(65536), 5)
            assert chunk, f"the gateway closed the connection after {data!r}"
            data += chunk
        return data

    try:
        assert (await healthz()).startswith(b"HTTP/1.1 200")
        await asyncio.sleep(6.0)
        assert (await healthz()).startswith(b"HTTP/1.1 200")
    finally:
        writer.close()
