"""The gateway's ASGI entry: the proxied OpenAI routes go straight to the hot path, everything
else (models list, admin API, metrics, health) to the FastAPI app, which also owns the lifespan.

With an admin listener (`admin_address`, the local address of its socket), /admin/ answers only
there and the public listener answers 404 for it, so no reverse proxy or open port in front of
the public listener reaches the admin API; the admin listener serves nothing but /admin/,
/healthz and /metrics. Without one (tests serving a single socket), both share the listener.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from gateway.asgi import send_error
from gateway.errors import ApiError
from gateway.proxy import handle_proxied
from gateway.request_body import PROXIED_PATHS

_PROXIED = frozenset(PROXIED_PATHS)
ADMIN_PREFIX = "/admin/"
ADMIN_LISTENER_PATHS = frozenset({"/healthz", "/metrics"})


def _not_found() -> ApiError:
    return ApiError(404, "Not Found", code="not_found")


class FrontDoor:
    def __init__(self, api: FastAPI, admin_address: tuple[str, int] | None = None) -> None:
        self.api = api
        self.admin_address = admin_address

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.admin_address is not None:
            on_admin = tuple(scope.get("server") or ())[:2] == self.admin_address
            path: str = scope["path"]
            is_admin_path = path.startswith(ADMIN_PREFIX)
            if is_admin_path != on_admin and not (on_admin and path in ADMIN_LISTENER_PATHS):
                await send_error(send, _not_found())
                return
        if scope["type"] == "http" and scope["path"] in _PROXIED:
            if scope["method"] != "POST":
                await send_error(
                    send,
                    ApiError(
                        405,
                        f"{scope['path']} takes POST.",
                        code="method_not_allowed",
                        headers={"Allow": "POST"},
                    ),
                )
                return
            await handle_proxied(self.api.state.gateway, scope, receive, send)
            return
        await self.api(scope, receive, send)
