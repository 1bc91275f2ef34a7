"""The playground on the remote console (/console/v1/playground/...): behind the console's login
and CSRF token, and then the OpenAI route's own path with whichever API key the operator pastes,
here a client key that is no admin key. The real app and store, the llama-server stand-in."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from gateway.observe.request_log import RequestFilter
from tests.browser_kit import until
from tests.console_kit import ConsoleGateway, console_gateway
from tests.gateway_kit import MODEL, fast_settings, recording_standin_thread, route
from tests.unit.test_console_remote import logged_in, make_key
from workflows.contracts import RoutingTable

CHAT = "/console/v1/playground/chat/completions"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "stream": True}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleGateway]:
    tmp = tmp_path_factory.mktemp("remote-playground")
    settings = fast_settings(console_remote=True, auth_failures_before_lockout=50)
    with recording_standin_thread(tmp) as engine, console_gateway(tmp, settings) as gateway:
        gateway.catalog.table = RoutingTable(version=2, routes=[route("smol-0", engine.url)])
        deadline = time.monotonic() + 10
        while not gateway.state.routes.snapshot.ready(MODEL):
            assert time.monotonic() < deadline, "the gateway never read the routes"
            time.sleep(0.02)
        yield gateway


def test_the_remote_playground_needs_the_session_and_its_csrf_token(
    gateway: ConsoleGateway,
) -> None:
    admin = make_key(gateway, "remote-ops", admin=True)
    client_key = make_key(gateway, "remote-app", admin=False)
    auth = {"Authorization": f"Bearer {client_key}", "Origin": gateway.url}
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as http:
        # No session: the login's refusal, whatever key the request carries.
        assert http.post(CHAT, json=BODY, headers=auth).status_code == 401
        csrf = logged_in(http, gateway, admin)
        assert http.post(CHAT, json=BODY, headers=auth).json()["error"]["code"] == "csrf"
        models = http.get("/console/v1/playground/models", headers={"Origin": gateway.url})
        assert [m["model"] for m in models.json()["data"]] == [MODEL]
        with_token = {**auth, "X-CSRF-Token": csrf}
        wrong = http.post(
            CHAT, json=BODY, headers={**with_token, "Authorization": "Bearer sk-llmgw-wrong"}
        )
        assert wrong.status_code == 401
        assert wrong.json()["error"]["code"] == "invalid_api_key"
        with http.stream("POST", CHAT, json=BODY, headers=with_token) as response:
            assert response.status_code == 200
            lines = [line for line in response.iter_lines() if line]
        assert lines[-1] == "data: [DONE]"
        log = gateway.state.request_log
        assert log is not None
        wanted = RequestFilter(request_id=response.headers["x-request-id"])
        # The gateway logs a request once its handler returns, after the last byte went out: a
        # client that has read [DONE] can ask before then (a fresh clone's run did).
        (record,) = until(lambda: log.query(wanted, 1), "the request's log record", within_s=5)
        assert (record.key_name, record.replica, record.status) == ("remote-app", "smol-0", 200)
