"""The web console on the public listener, under /console/, behind a login with an admin key.

Served only when the gateway runs with `console_remote` (`llmgw gateway --console-remote`);
otherwise none of these routes exist and /console/ is a 404. The admin API itself stays on the
loopback admin listener: what is reachable here is the console's page and files, and the JSON
and commands the page uses, each answered by the admin route's own handler (re-registered
below, not copied), behind `require_session` instead of the loopback gate.

- Login: a form posting an API key. A key that is unknown, wrong, revoked, expired or not an
  admin key gets the one refusal, and counts as a failed authentication for the lockout the
  OpenAI API uses (gateway/lockout.py, shared with the other gateways on the store).
- A login starts a server-side session (gateway/console/sessions.py) whose id is the cookie:
  HttpOnly (no script reads it), SameSite=Strict (no other site's page or link sends it),
  Path=/console, and Secure unless the browser spoke plain http to a loopback name.
- Every console request checks the session (and that its key is still an active admin key), and
  that no browser marks it cross-site (Origin must be this very host). A change must also be
  application/json and carry the session's CSRF token in X-CSRF-Token; the page reads the token
  from a meta tag of the page the server fills in, so no inline script is needed.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from importlib import resources
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from gateway.admin import keys as admin_keys
from gateway.admin import models as admin_models
from gateway.admin import observe as admin_observe
from gateway.admin import playground as admin_playground
from gateway.admin.guard import (
    WRITE_METHODS,
    check_json_body,
    check_same_site,
    is_loopback_client,
    split_authority,
)
from gateway.auth import AuthFailed
from gateway.console import routes as console_routes
from gateway.console.routes import SECURITY_HEADERS
from gateway.console.sessions import LIFETIME_S, Session, csrf_matches
from gateway.deps import GatewayState, State
from gateway.errors import ApiError
from gateway.lockout import stored_group

PREFIX = "/console"
COOKIE = "llmgw_console"
CSRF_HEADER = "x-csrf-token"
LOGIN_PATH = f"{PREFIX}/login"
# An API key is ~60 characters; a login form is far below this.
MAX_LOGIN_BODY = 4096
NOT_ADMIN = "not_admin"
# The login page posts its form to itself, the only differences from the console's headers:
# its policy lets a form post to this origin, and its referrer policy is same-origin because
# under no-referrer a browser sends a form's POST with `Origin: null`, which the origin check
# must refuse.
LOGIN_HEADERS = {
    **SECURITY_HEADERS,
    "Content-Security-Policy": SECURITY_HEADERS["Content-Security-Policy"].replace(
        "form-action 'none'", "form-action 'self'"
    ),
    "Referrer-Policy": "same-origin",
}


def cookie_is_secure(scheme: str, host_header: str) -> bool:
    """Secure, so the browser sends the session only over TLS, unless the browser spoke plain
    http to a loopback name (127.0.0.1, ::1, localhost): then no one else is on the wire. The
    gateway reads no X-Forwarded-* headers, so behind a TLS proxy the scheme is http and the
    Host (the browser's, which the proxy must pass on) is what keeps the cookie Secure."""
    if scheme == "https":
        return True
    authority = split_authority(host_header)
    loopback = authority is not None and (
        authority[0] == "localhost" or is_loopback_client(authority[0])
    )
    return not loopback


def _session_cookie(session_id: str, secure: bool) -> str:
    parts = [
        f"{COOKIE}={session_id}",
        "HttpOnly",
        "SameSite=Strict",
        f"Path={PREFIX}",
        f"Max-Age={int(LIFETIME_S)}",
    ]
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


def _cleared_cookie() -> str:
    return f"{COOKIE}=; HttpOnly; SameSite=Strict; Path={PREFIX}; Max-Age=0"


def _state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


def _session(request: Request, state: GatewayState) -> Session | None:
    """The request's live session, if its key is still an active admin key."""
    session_id = request.cookies.get(COOKIE)
    session = state.console_sessions.find(session_id, time.monotonic())
    if session is None:
        return None
    key = state.keys.find(session.key_id)
    if key is None or not key.admin or key.revoked_at is not None:
        state.console_sessions.end(session_id)
        return None
    if key.is_expired(datetime.now(UTC)):
        state.console_sessions.end(session_id)
        return None
    return session


def require_session(request: Request) -> None:
    """The gate of every console JSON and command route here."""
    check_same_site(request.headers, any_host_name=True)
    state = _state(request)
    session = _session(request, state)
    if session is None:
        raise ApiError(401, "Log in to the console.", type_="authentication_error", code="login")
    if request.method.upper() in WRITE_METHODS:
        check_json_body(request.headers)
        if not csrf_matches(session, request.headers.get(CSRF_HEADER)):
            raise ApiError(
                403,
                "Refused: the request lacks this session's CSRF token.",
                type_="permission_error",
                code="csrf",
            )


pages = APIRouter(prefix=PREFIX)
api = APIRouter(prefix=f"{PREFIX}/v1", dependencies=[Depends(require_session)])

# The console's JSON and commands: the admin routes' own handlers, at the same paths under
# /console/v1 instead of /admin/v1.
api.add_api_route("/console", console_routes.console_data, methods=["GET"])
api.add_api_route("/nodes/{name}/{action}", console_routes.node_command, methods=["POST"])
api.add_api_route("/models/{name}/scale", console_routes.scale_model, methods=["POST"])
api.add_api_route("/imports/ollama", console_routes.import_ollama, methods=["POST"])
api.add_api_route("/models/{name}", admin_models.put_model, methods=["PUT"])
api.add_api_route("/keys", admin_keys.create_key, methods=["POST"], response_model=None)
api.add_api_route("/keys/{name_or_id}", admin_keys.revoke_key, methods=["DELETE"])
api.add_api_route("/keys/{name_or_id}/limits", admin_keys.set_limits, methods=["PUT"])
api.add_api_route("/requests", admin_observe.requests, methods=["GET"])
api.add_api_route("/series", admin_observe.series, methods=["GET"])
# The playground: its request goes on to the OpenAI route's handler with the operator's API key.
api.add_api_route("/playground/models", admin_playground.models, methods=["GET"])
api.add_api_route(
    "/playground/chat/completions", admin_playground.chat_completions, methods=["POST"]
)


def _read(name: str) -> str:
    return resources.files("gateway.console").joinpath("static", name).read_text("utf-8")


def _login_page(status: int, refused: bool, headers: dict[str, str] | None = None) -> Response:
    page = _read("login.html")
    if refused:
        page = page.replace('role="alert" hidden>', 'role="alert">', 1)
    return Response(
        page,
        status_code=status,
        media_type="text/html; charset=utf-8",
        headers={**LOGIN_HEADERS, **(headers or {})},
    )


@pages.get("/login")
async def login_page() -> Response:
    return _login_page(200, refused=False)


@pages.post("/login")
async def login(request: Request) -> Response:
    check_same_site(request.headers, any_host_name=True)
    state = _state(request)
    client = request.client.host if request.client else ""
    now = time.monotonic()
    locked_for = state.lockout.retry_after(client, now)
    if locked_for is not None:
        state.metrics.auth_failed("locked_out")
        return _login_page(429, refused=True, headers={"Retry-After": str(int(locked_for) + 1)})
    key_text = await _posted_key(request)
    try:
        key = await state.keys.authenticate(f"Bearer {key_text}" if key_text else None)
        if not key.admin:
            raise AuthFailed(NOT_ADMIN)
    except AuthFailed as err:
        started = state.lockout.failed(client, now)
        if started is not None:
            state.limits.locked_out(stored_group(client), started)
        state.metrics.auth_failed(err.reason)
        return _login_page(401, refused=True)
    state.lockout.succeeded(client, now)
    session_id, _ = state.console_sessions.start(key.key_id, now)
    secure = cookie_is_secure(request.url.scheme, request.headers.get("host", ""))
    response = RedirectResponse(f"{PREFIX}/", status_code=303, headers=SECURITY_HEADERS)
    response.headers.append("Set-Cookie", _session_cookie(session_id, secure))
    return response


async def _posted_key(request: Request) -> str:
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/x-www-form-urlencoded":
        raise ApiError(415, "The login takes a form.", code="unsupported_media_type")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_LOGIN_BODY:
            raise ApiError(413, "The login form is too large.", code="body_too_large")
    fields = parse_qs(body.decode("utf-8", "replace"), max_num_fields=4)
    return (fields.get("key") or [""])[0].strip()


@pages.post("/logout", dependencies=[Depends(require_session)])
async def logout(request: Request) -> JSONResponse:
    _state(request).console_sessions.end(request.cookies.get(COOKIE))
    response = JSONResponse({"logged_out": True}, headers=SECURITY_HEADERS)
    response.headers.append("Set-Cookie", _cleared_cookie())
    return response


@pages.get("")
@pages.get("/")
async def console_page(request: Request, state: State) -> Response:
    session = _session(request, state)
    if session is None:
        return RedirectResponse(LOGIN_PATH, status_code=303, headers=SECURITY_HEADERS)
    token = session.csrf_token
    page = (
        _read("index.html")
        .replace("/admin/console/", f"{PREFIX}/")
        .replace('content="/admin/v1"', f'content="{PREFIX}/v1"', 1)
        # The token is URL-safe base64: nothing in it needs escaping in an attribute.
        .replace('name="llmgw-csrf" content=""', f'name="llmgw-csrf" content="{token}"', 1)
    )
    return Response(page, media_type="text/html; charset=utf-8", headers=SECURITY_HEADERS)


@pages.get("/{name}")
async def console_asset(name: str) -> Response:
    """The console's stylesheet, scripts and icon: the package's files, the same for everyone
    (no data in them), so the login page can use them before a session exists."""
    if name == "index.html":
        raise ApiError(404, "Not Found", code="not_found")
    return console_routes.asset(name)
