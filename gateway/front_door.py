"""The gateway's ASGI entry: the proxied OpenAI routes go straight to the hot path, everything
else (models list, admin API, metrics, health) to the FastAPI app, which also owns the lifespan.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from gateway.asgi import send_error
from gateway.errors import ApiError
from gateway.proxy import handle_proxied
from gateway.request_body import PROXIED_PATHS

_PROXIED = frozenset(PROXIED_PATHS)


class FrontDoor:
    def __init__(self, api: FastAPI) -> None:
        self.api = api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
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
