"""The gateway's ASGI entry: the proxied OpenAI routes go straight to the hot path, everything
else (models list, admin API, metrics, health) to the FastAPI app, which also owns the lifespan.

With an admin listener (`admin_address`, the local address of its socket), /admin/ and /metrics
answer only there and the public listener answers 404 for them, so no reverse proxy or open port
in front of the public listener reaches the admin API or the metrics (which name every model and
count every key failure); the admin listener serves nothing but /admin/, /healthz and /metrics.
/healthz answers on both. Without one (tests serving a single socket), both share the listener.

Outermost, a guard: an exception from any route becomes a JSON 500 with a request id, logged
with its traceback under that id, rather than the plain-text 500 the server would send.
"""

from __future__ import annotations

from collections.abc import Awaitable

from fastapi import FastAPI
from starlette.types import Message, Receive, Scope, Send

from gateway.asgi import send_error
from gateway.errors import ApiError, internal_error, log_unexpected
from gateway.proxy import handle_proxied
from gateway.request_body import PROXIED_PATHS

_PROXIED = frozenset(PROXIED_PATHS)
ADMIN_PREFIX = "/admin/"
# Served by the admin listener only, besides /admin/.
ADMIN_ONLY_PATHS = frozenset({"/metrics"})
# Served by the admin listener besides the admin-only paths; the public one serves them too.
ADMIN_LISTENER_PATHS = frozenset({"/healthz"}) | ADMIN_ONLY_PATHS


def _not_found() -> ApiError:
    return ApiError(404, "Not Found", code="not_found")


def admin_only(path: str) -> bool:
    return path.startswith(ADMIN_PREFIX) or path in ADMIN_ONLY_PATHS


def allowed_on(path: str, on_admin: bool) -> bool:
    """Whether the listener (admin or public) serves `path`."""
    if on_admin:
        return path.startswith(ADMIN_PREFIX) or path in ADMIN_LISTENER_PATHS
    return not admin_only(path)


class FrontDoor:
    def __init__(self, api: FastAPI, admin_address: tuple[str, int] | None = None) -> None:
        self.api = api
        self.admin_address = admin_address

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.api(scope, receive, send)  # the lifespan
            return
        started = False

        # Not async itself: it hands back send's awaitable, so each message the response sends
        # (a stream's many chunks) goes through no extra coroutine.
        def tracked(message: Message) -> Awaitable[None]:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            return send(message)

        try:
            await self._route(scope, receive, tracked)
        except Exception as exc:  # noqa: BLE001 - the outermost ASGI layer: any bug is a JSON 500
            # The FastAPI app has logged (and answered) its own already; log_unexpected then
            # returns that id without logging it again.
            request_id = log_unexpected(exc, scope.get("method", "?"), scope.get("path", "?"))
            if not started:
                await send_error(send, internal_error(request_id))
            # Once started, the status is on the wire: returning without finishing the response
            # makes the server close the connection, which the client sees as a cut response.
            # Not re-raised: the server would log the same traceback again, without the id.

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        if self.admin_address is not None:
            on_admin = tuple(scope.get("server") or ())[:2] == self.admin_address
            if not allowed_on(path, on_admin):
                await send_error(send, _not_found())
                return
        if path in _PROXIED:
            if scope["method"] != "POST":
                await send_error(
                    send,
                    ApiError(
                        405,
                        f"{path} takes POST.",
                        code="method_not_allowed",
                        headers={"Allow": "POST"},
                    ),
                )
                return
            await handle_proxied(self.api.state.gateway, scope, receive, send)
            return
        await self.api(scope, receive, send)
