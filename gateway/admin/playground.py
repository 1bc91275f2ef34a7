"""The console's playground: a chat request sent from the console's page, answered by the very
path a client's request takes.

The OpenAI API listens on another port than the admin listener, so a page on the console cannot
call it (another origin, and the gateway grants no CORS). POST /admin/v1/playground/chat/
completions (and, with `--console-remote`, /console/v1/playground/chat/completions) is that call
on the console's own origin: its gate is the console's (loopback or session, same-site JSON),
then the request, its body and its headers, the operator's API key as Authorization among them,
go to gateway/proxy.py's `handle_proxied` as if sent to /v1/chat/completions. Lockout, the key,
its allowlists, limits and quotas, the fair queue, routing, usage and the request log all apply
as for any client: nothing here judges the key or the body, and no request goes without one.

GET /admin/v1/playground/models: what the page offers, each model of the routing table with its
ready replicas and the LoRA adapters its replicas load (/v1/models without a key's allowlists).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.admin.models import require_same_site_json
from gateway.admin.routes import require_local
from gateway.deps import GatewayState, State
from gateway.proxy import handle_proxied
from gateway.request_body import CHAT
from gateway.routing import RoutingSnapshot

router = APIRouter(prefix="/admin/v1/playground", dependencies=[Depends(require_local)])


def playground_models(snapshot: RoutingSnapshot) -> list[dict[str, Any]]:
    """Each model the gateway routes, its ready replicas, and its replicas' adapters (in the
    order they first appear), sorted by name."""
    models = []
    for model in sorted(snapshot.models()):
        adapters = dict.fromkeys(a for r in snapshot.routes(model) for a in r.adapters)
        models.append(
            {"model": model, "ready_replicas": len(snapshot.ready(model)), "adapters": [*adapters]}
        )
    return models


class ThroughTheProxy(Response):
    """Not a response of its own: the ASGI call handed on to the proxied route's handler, with
    the path the request would have on the OpenAI API (what its metrics, trace and request log
    record). The body is still unread, so the handler reads it with its own size limit."""

    def __init__(self, state: GatewayState) -> None:
        super().__init__()
        self.gateway = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        public = {**scope, "path": CHAT, "raw_path": CHAT.encode(), "root_path": ""}
        await handle_proxied(self.gateway, public, receive, send)


@router.get("/models")
async def models(state: State) -> dict[str, Any]:
    return {"data": playground_models(state.routes.snapshot)}


@router.post("/chat/completions", dependencies=[Depends(require_same_site_json)])
async def chat_completions(state: State) -> Response:
    """POST /v1/chat/completions for the console's page: streamed when the body asks."""
    return ThroughTheProxy(state)
