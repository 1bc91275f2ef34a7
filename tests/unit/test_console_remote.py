"""The remote console (`llmgw gateway --console-remote`) over HTTP without a browser: off by
default, the login with an admin key, the session's cookie and CSRF token, cross-origin
refusals, expiry, logout and the lockout. The real app and store, the stand-in cluster."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Iterator

import httpx
import pytest

from gateway.console.remote import COOKIE
from gateway.console.sessions import LIFETIME_S
from gateway.front_door import allowed_on
from gateway.server import serve
from store import Store
from tests.console_kit import ConsoleGateway, console_gateway
from tests.console_standin import RACK
from tests.gateway_kit import FakeRouteSource, fast_settings, running_gateway
from tests.ports import free_port

CSRF_META = re.compile(r'<meta name="llmgw-csrf" content="([^"]+)">')


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleGateway]:
    settings = fast_settings(console_remote=True, auth_failures_before_lockout=50)
    with console_gateway(tmp_path_factory.mktemp("remote"), settings) as gateway:
        yield gateway


def make_key(gateway: ConsoleGateway, name: str, admin: bool) -> str:
    """A key made in the store, returned once this gateway's key refresh has read it."""
    record, plaintext = gateway.call(gateway.store.create_key(name, admin=admin))
    deadline = time.monotonic() + 10
    while gateway.state.keys.find(record.key_id) is None:
        assert time.monotonic() < deadline, "the gateway never read the new key"
        time.sleep(0.02)
    return str(plaintext)


@pytest.fixture(scope="module")
def admin_key(gateway: ConsoleGateway) -> str:
    return make_key(gateway, "ops", admin=True)


@pytest.fixture(scope="module")
def client_key(gateway: ConsoleGateway) -> str:
    return make_key(gateway, "app", admin=False)


@pytest.fixture
def http(gateway: ConsoleGateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, trust_env=False) as client:
        yield client


def login(http: httpx.Client, gateway: ConsoleGateway, key: str) -> httpx.Response:
    # A browser posting the login form sends its Origin, which must be this host.
    return http.post("/console/login", data={"key": key}, headers={"Origin": gateway.url})


def logged_in(http: httpx.Client, gateway: ConsoleGateway, key: str) -> str:
    """Logs `http` in; returns the CSRF token the page carries."""
    assert login(http, gateway, key).status_code == 303
    page = http.get("/console/")
    assert page.status_code == 200
    match = CSRF_META.search(page.text)
    assert match is not None, "the page names the session's CSRF token"
    return match.group(1)


async def test_the_remote_console_is_off_by_default(store: Store) -> None:
    async with running_gateway(store, FakeRouteSource()) as gw:
        for path in ("/console/", "/console/login", "/console/console.js", "/console/v1/console"):
            assert (await gw.client.get(path)).status_code == 404, path
        response = await gw.client.post("/console/login", data={"key": gw.api_key})
        assert response.status_code == 404


def test_console_paths_are_public_and_the_admin_api_is_not() -> None:
    assert allowed_on("/console/", on_admin=False)
    assert not allowed_on("/console/", on_admin=True)
    assert not allowed_on("/admin/v1/keys", on_admin=False)
    assert not allowed_on("/admin/console/", on_admin=False)


def test_an_admin_key_logs_in_to_the_console(
    http: httpx.Client, gateway: ConsoleGateway, admin_key: str
) -> None:
    assert http.get("/console/login").status_code == 200
    response = login(http, gateway, admin_key)
    assert response.status_code == 303
    assert response.headers["location"] == "/console/"
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=")
    for attribute in ("HttpOnly", "SameSite=Strict", "Path=/console", f"Max-Age={int(LIFETIME_S)}"):
        assert attribute in cookie
    # Plain http to 127.0.0.1: the one case the cookie is not Secure (see cookie_is_secure).
    assert "Secure" not in cookie
    page = http.get("/console/")
    assert page.status_code == 200
    assert 'src="/console/console.js"' in page.text
    assert 'name="llmgw-api" content="/console/v1"' in page.text
    assert "unsafe-inline" not in page.headers["content-security-policy"]
    assert page.headers["cache-control"] == "no-store"
    data = http.get("/console/v1/console").json()
    assert "ops" in [key["name"] for key in data["gateway"]["keys"]]
    assert data["cluster"]["nodes"]
    # The Requests and Charts pages' data, at the admin API's paths under /console/v1.
    assert http.get("/console/v1/requests").json()["size"] > 0
    assert http.get("/console/v1/series").json()["bucket_s"] == 10


def test_a_client_key_and_a_wrong_key_get_the_same_refusal(
    http: httpx.Client, gateway: ConsoleGateway, client_key: str, admin_key: str
) -> None:
    wrong = admin_key[:-4] + ("AAAA" if not admin_key.endswith("AAAA") else "BBBB")
    answers = [login(http, gateway, key) for key in (client_key, wrong, "not-a-key", "")]
    assert [a.status_code for a in answers] == [401] * 4
    assert len({a.text for a in answers}) == 1
    assert "Login refused." in answers[0].text
    assert all("set-cookie" not in a.headers for a in answers)
    assert http.get("/console/v1/console").status_code == 401


def test_without_a_session_nothing_is_served_but_the_login(
    http: httpx.Client, gateway: ConsoleGateway
) -> None:
    before = list(gateway.cluster.commands)
    page = http.get("/console/")
    assert page.status_code == 303
    assert page.headers["location"] == "/console/login"
    assert http.get("/console/v1/console").status_code == 401
    assert http.get("/console/v1/requests").status_code == 401
    assert http.get("/console/v1/series").status_code == 401
    http.cookies.set(COOKIE, "made-up", domain="127.0.0.1", path="/console")
    assert http.get("/console/v1/console").status_code == 401
    response = http.post(f"/console/v1/nodes/{RACK[0]}/cordon", json={})
    assert response.status_code == 401
    imported = http.post("/console/v1/imports/ollama", json={"reference": "smollm2:135m"})
    assert imported.status_code == 401
    assert gateway.cluster.commands == before


def test_a_change_needs_the_sessions_csrf_token(
    http: httpx.Client, gateway: ConsoleGateway, admin_key: str
) -> None:
    token = logged_in(http, gateway, admin_key)
    path = f"/console/v1/nodes/{RACK[1]}/cordon"
    before = list(gateway.cluster.commands)
    assert http.post(path, json={}).status_code == 403
    assert http.post(path, json={}, headers={"X-CSRF-Token": "x" * 43}).status_code == 403
    plain = {"X-CSRF-Token": token, "Content-Type": "text/plain"}
    assert http.post(path, content="{}", headers=plain).status_code == 415
    assert gateway.cluster.commands == before
    done = http.post(path, json={"reason": "remote"}, headers={"X-CSRF-Token": token})
    assert done.status_code == 200, done.text
    assert len(gateway.cluster.commands) == len(before) + 1
    # The admin route's own validation answers here too.
    bad = http.post(
        "/console/v1/models/qwen/scale", json={"replicas": -1}, headers={"X-CSRF-Token": token}
    )
    assert bad.status_code == 400
    assert "replicas" in bad.json()["error"]["message"]
    tokenless = http.post("/console/v1/imports/ollama", json={"reference": "smollm2:135m"})
    assert tokenless.status_code == 403
    unknown = http.post(
        "/console/v1/imports/ollama", json={"reference": "nothere"}, headers={"X-CSRF-Token": token}
    )
    assert unknown.status_code == 404
    assert "no model nothere" in unknown.json()["error"]["message"]
    made = http.post(
        "/console/v1/keys", json={"name": "from-remote"}, headers={"X-CSRF-Token": token}
    )
    assert made.status_code == 201
    assert made.json()["key"]["admin"] is False
    # The admin API's key creation takes the role, and so the console's.
    second = http.post(
        "/console/v1/keys", json={"name": "ops-2", "admin": True}, headers={"X-CSRF-Token": token}
    )
    assert second.status_code == 201
    assert second.json()["key"]["admin"] is True


def test_another_origin_is_refused_even_with_the_token(
    http: httpx.Client, gateway: ConsoleGateway, admin_key: str
) -> None:
    token = logged_in(http, gateway, admin_key)
    before = list(gateway.cluster.commands)
    evil = {"X-CSRF-Token": token, "Origin": "https://evil.example"}
    assert http.post(f"/console/v1/nodes/{RACK[2]}/drain", json={}, headers=evil).status_code == 403
    cross = {"Sec-Fetch-Site": "cross-site"}
    assert http.get("/console/v1/console", headers=cross).status_code == 403
    assert gateway.cluster.commands == before
    # Nor can another site's page log a browser in (login CSRF).
    response = http.post(
        "/console/login", data={"key": admin_key}, headers={"Origin": "https://evil.example"}
    )
    assert response.status_code == 403


def test_an_expired_session_has_to_log_in_again(
    http: httpx.Client, gateway: ConsoleGateway, admin_key: str
) -> None:
    logged_in(http, gateway, admin_key)
    session_id = http.cookies[COOKIE]

    async def later() -> None:
        # The book as it will be a lifetime from now: past it, the session is gone.
        gateway.state.console_sessions.find(session_id, time.monotonic() + LIFETIME_S)

    gateway.call(later())
    assert http.get("/console/v1/console").status_code == 401
    assert http.get("/console/").headers["location"] == "/console/login"


def test_logout_ends_the_session(
    http: httpx.Client, gateway: ConsoleGateway, admin_key: str
) -> None:
    token = logged_in(http, gateway, admin_key)
    session_id = http.cookies[COOKIE]
    assert http.post("/console/logout", json={}).status_code == 403, "logout needs the token"
    out = http.post("/console/logout", json={}, headers={"X-CSRF-Token": token})
    assert out.status_code == 200
    assert "Max-Age=0" in out.headers["set-cookie"]
    # Even a client that kept the old cookie is out.
    http.cookies.set(COOKIE, session_id, domain="127.0.0.1", path="/console")
    assert http.get("/console/v1/console").status_code == 401


def test_revoking_the_admin_key_ends_its_sessions(
    http: httpx.Client, gateway: ConsoleGateway
) -> None:
    key = make_key(gateway, "short-lived-admin", admin=True)
    logged_in(http, gateway, key)
    assert http.get("/console/v1/console").status_code == 200
    assert gateway.call(gateway.store.revoke_key("short-lived-admin"))
    deadline = time.monotonic() + 10
    while http.get("/console/v1/console").status_code != 401:
        assert time.monotonic() < deadline, "a revoked admin key kept its session"
        time.sleep(0.05)


def test_repeated_failures_lock_the_client_out(tmp_path_factory: pytest.TempPathFactory) -> None:
    settings = fast_settings(console_remote=True, auth_failures_before_lockout=3)
    with (
        console_gateway(tmp_path_factory.mktemp("lockout"), settings) as gateway,
        httpx.Client(base_url=gateway.url, trust_env=False) as http,
    ):
        admin_key = make_key(gateway, "ops", admin=True)
        for _ in range(3):
            assert login(http, gateway, "llmgw-00000000-wrong").status_code == 401
        # Locked out: even the right key is refused for now, and told when to retry.
        locked = login(http, gateway, admin_key)
        assert locked.status_code == 429
        assert int(locked.headers["retry-after"]) > 0
        assert COOKIE not in http.cookies


def test_the_gateway_flag_turns_the_remote_console_on() -> None:
    from workers.cli import build_parser
    from workers.commands.gateway_flags import gateway_settings

    assert not gateway_settings(build_parser().parse_args(["gateway"])).console_remote
    on = gateway_settings(build_parser().parse_args(["gateway", "--console-remote"]))
    assert on.console_remote


async def test_with_both_listeners_the_login_is_public_and_the_admin_api_is_not(
    store: Store,
) -> None:
    port, admin_port = free_port(), free_port()
    settings = fast_settings(port=port, admin_port=admin_port, console_remote=True)
    task = asyncio.create_task(serve(settings, store, FakeRouteSource()))
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=5) as http:
            public, admin = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}"
            deadline = time.monotonic() + 10
            while True:
                try:
                    await http.get(public + "/healthz")
                    break
                except httpx.ConnectError:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
            assert (await http.get(public + "/console/login")).status_code == 200
            assert (await http.get(public + "/console/v1/console")).status_code == 401
            assert (await http.get(public + "/admin/console/")).status_code == 404
            assert (await http.get(public + "/admin/v1/keys")).status_code == 404
            assert (await http.get(admin + "/admin/console/")).status_code == 200
            assert (await http.get(admin + "/console/login")).status_code == 404
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, RuntimeError):
            await task
