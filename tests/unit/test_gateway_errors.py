"""No plain-text 500 anywhere: an exception in any route answers a JSON error with a request id,
logged with its traceback under that id. Also which listener serves which path. The front door
is driven in process (no server) except for one request through a real uvicorn, which is what
would otherwise answer a bare "Internal Server Error"."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.types import Message, Receive, Scope, Send

from gateway import front_door, proxy
from gateway.errors import install_error_handlers
from gateway.front_door import FrontDoor, allowed_on
from store import Store
from tests.gateway_kit import (
    FakeRouteSource,
    assert_openai_error,
    recording_upstream,
    route,
    running_gateway,
)

PUBLIC, ADMIN = ("127.0.0.1", 8000), ("127.0.0.1", 8001)


def _api() -> FastAPI:
    api = FastAPI()
    install_error_handlers(api)

    @api.get("/v1/models")
    async def broken() -> dict[str, Any]:
        raise RuntimeError("the routing snapshot is corrupt")

    @api.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok"}

    @api.get("/metrics")
    async def metrics() -> dict[str, Any]:
        return {}

    @api.get("/admin/v1/routes")
    async def routes() -> dict[str, Any]:
        return {}

    return api


def _client(door: FrontDoor, listener: tuple[str, int] = PUBLIC) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=door),
        base_url=f"http://{listener[0]}:{listener[1]}",
    )


def _request_id(response: httpx.Response, caplog: pytest.LogCaptureFixture) -> str:
    """The request id of a JSON 500, checked to be the one its logged traceback carries."""
    assert_openai_error(response, 500, "internal_error")
    assert response.headers["content-type"] == "application/json"
    request_id = response.headers["x-request-id"]
    assert re.fullmatch(r"req_[0-9a-f]{24}", request_id)
    assert request_id in response.json()["error"]["message"]
    logged = [r for r in caplog.records if request_id in r.getMessage()]
    assert len(logged) == 1, "logged once, with its id"
    assert logged[0].exc_info is not None, "with its traceback"
    return request_id


async def test_an_exception_in_a_fastapi_route_is_a_json_500_with_a_request_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with _client(FrontDoor(_api())) as client:
        response = await client.get("/v1/models")
    _request_id(response, caplog)
    assert "corrupt" not in response.text


async def test_an_exception_on_the_proxied_path_is_a_json_500_with_a_request_id(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(_state: object, _scope: Scope, _receive: Receive, _send: Send) -> None:
        raise RuntimeError("a bug in the hot path")

    monkeypatch.setattr(front_door, "handle_proxied", broken)
    api = _api()
    api.state.gateway = None
    async with _client(FrontDoor(api)) as client:
        first = await client.post("/v1/chat/completions", json={"model": "m"})
        second = await client.post("/v1/chat/completions", json={"model": "m"})
    assert _request_id(first, caplog) != _request_id(second, caplog)


async def test_a_failure_after_the_response_started_is_logged_not_answered_twice(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def streams_then_fails(_scope: Scope, _receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        raise RuntimeError("the relay broke mid-stream")

    api = _api()
    api.mount("/stream", streams_then_fails)
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {"type": "http", "method": "GET", "path": "/stream/x", "headers": [], "app": api}
    await FrontDoor(api)(scope, receive, send)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 200
    assert "unhandled error on GET /stream/x [req_" in caplog.text


async def test_a_real_server_answers_json_not_text_for_a_bug_on_the_hot_path(
    store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(_state: object, _model: str) -> object:
        raise RuntimeError("the routing estimate broke")

    async with (
        recording_upstream() as upstream,
        running_gateway(store, FakeRouteSource(route("smol-0", upstream.url))) as gw,
    ):
        monkeypatch.setattr(proxy, "_routable_snapshot", broken)
        response = await gw.chat()
        # The gateway is still serving: the next request gets the same answer, not a refusal.
        again = await gw.chat()
    _request_id(response, caplog)
    assert again.status_code == 500
    assert upstream.seen == []
    assert "estimate" not in json.dumps(response.json())


# --- which listener serves what -----------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "public", "admin"),
    [
        ("/healthz", True, True),
        ("/metrics", False, True),
        ("/admin/v1/routes", False, True),
        ("/v1/models", True, False),
        ("/v1/chat/completions", True, False),
    ],
)
def test_metrics_and_the_admin_api_answer_on_the_admin_listener_only(
    path: str, public: bool, admin: bool
) -> None:
    assert allowed_on(path, on_admin=False) is public
    assert allowed_on(path, on_admin=True) is admin


async def test_the_public_listener_answers_404_for_metrics() -> None:
    door = FrontDoor(_api(), admin_address=ADMIN)
    async with _client(door, PUBLIC) as public, _client(door, ADMIN) as admin:
        assert_openai_error(await public.get("/metrics"), 404, "not_found")
        assert (await admin.get("/metrics")).status_code == 200
        assert (await public.get("/healthz")).status_code == 200
        assert (await admin.get("/healthz")).status_code == 200


@pytest.fixture(autouse=True)
def _errors_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="gateway.errors")
