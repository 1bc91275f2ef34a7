"""The web console on the admin listener: its page and assets under /admin/console/, the JSON it
polls (GET /admin/v1/console), and the commands the admin API lacked until the console needed
them: a node's cordon, uncordon or drain, a model's scale, and an import from Ollama.

Everything here sits behind the admin API's gate (`require_local`: loopback clients, Host an
address or localhost, nothing a browser marks cross-site) and changes come as same-site JSON
(`require_same_site_json`), as every other admin change does. Keys and model definitions are
not handled here: the console's page calls the admin API's own routes for them
(gateway/admin/keys.py, gateway/admin/models.py), so they pass the very same checks.

The page ships with a Content-Security-Policy that lets it load only its own files and talk
only to its own origin: no inline script or style, no frame, no form posted anywhere.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from gateway.admin.keys import key_view, parse_body
from gateway.admin.models import require_same_site_json
from gateway.admin.routes import require_local
from gateway.console.figures import queue_figures, routing_figures
from gateway.console.source import NODE_ACTIONS, ClusterCache, ConsoleRefused
from gateway.deps import State
from gateway.errors import ApiError
from workflows.contracts import ScaleRequest

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    # The page and its data name every key and model: never kept by a cache.
    "Cache-Control": "no-store",
}
# Every file the console serves, by name: nothing else under the package is reachable.
ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "api.js": "text/javascript; charset=utf-8",
    "dom.js": "text/javascript; charset=utf-8",
    "cluster_pages.js": "text/javascript; charset=utf-8",
    "fleet_pages.js": "text/javascript; charset=utf-8",
    "mirror_page.js": "text/javascript; charset=utf-8",
    "node_page.js": "text/javascript; charset=utf-8",
    "gateway_pages.js": "text/javascript; charset=utf-8",
    "observe_pages.js": "text/javascript; charset=utf-8",
    "playground_page.js": "text/javascript; charset=utf-8",
    "line_chart.js": "text/javascript; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
# Usage the keys page charts: the last month, by UTC day.
USAGE_DAYS = 31

pages = APIRouter(prefix="/admin/console", dependencies=[Depends(require_local)])
api = APIRouter(prefix="/admin/v1", dependencies=[Depends(require_local)])


def asset(name: str) -> Response:
    if name not in ASSETS:
        raise ApiError(404, "Not Found", code="not_found")
    body = resources.files("gateway.console").joinpath("static", name).read_bytes()
    return Response(body, media_type=ASSETS[name], headers=SECURITY_HEADERS)


@pages.get("")
@pages.get("/")
async def console_page() -> Response:
    return asset("index.html")


@pages.get("/{name}")
async def console_asset(name: str) -> Response:
    return asset(name)


def _cluster(state: State) -> ClusterCache:
    if state.console is None:
        # 404: to this gateway there are no nodes or models to command (`llmgw gateway` always
        # has a view; an embedding or a test may not).
        raise ApiError(404, "This gateway has no view of the cluster.", code="no_cluster")
    return state.console


@api.get("/console")
async def console_data(state: State) -> dict[str, Any]:
    """Everything the console's pages show, in one answer it polls."""
    cluster = await state.console.read() if state.console is not None else None
    since = datetime.now(UTC).date() - timedelta(days=USAGE_DAYS - 1)
    usage = await state.store.usage(since=since)
    return {
        "cluster": cluster,
        "gateway": {
            "routes_version": state.routes.snapshot.version,
            "routes_age_s": state.routes.age_s(),
            "routes_error": state.routes.last_error,
            "in_flight": sum(state.inflight.counts.values()),
            "keys": [key_view(key) for key in await state.store.list_keys()],
            "usage": [row.model_dump(mode="json") for row in usage],
            **routing_figures(state.metrics.registry),
            # Each model's routing state and its shares over the last minute, in memory.
            "routing_states": state.metrics.routing_view(),
            # The other gateway processes on the store, and whether each is heard now.
            "peers": state.peers.picture.peers() if state.peers is not None else None,
            "queue": queue_figures(
                state.admission,
                state.metrics.registry,
                {r.replica_id: r.model for r in state.routes.snapshot.table.routes},
            ),
        },
    }


class NodeCommandRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="", max_length=200)


def _refused(err: ConsoleRefused) -> ApiError:
    return ApiError(err.status, f"Refused: {err}", code="refused")


@api.post("/nodes/{name}/{action}", dependencies=[Depends(require_same_site_json)])
async def node_command(name: str, action: str, request: Request, state: State) -> dict[str, Any]:
    """`llmgw node cordon|uncordon|drain NAME`, through the same code as the CLI."""
    if action not in NODE_ACTIONS:
        raise ApiError(404, f"No node command {action!r}.", code="not_found")
    body = await parse_body(request, NodeCommandRequest)
    cache = _cluster(state)
    try:
        said = await cache.cluster.node_command(name, action, body.reason)
    except ConsoleRefused as err:
        raise _refused(err) from None
    cache.forget()
    return {"node": name, "action": action, "result": said}


@api.post("/models/{name}/scale", dependencies=[Depends(require_same_site_json)])
async def scale_model(name: str, request: Request, state: State) -> dict[str, Any]:
    """`llmgw model scale NAME N`: the model workflow's own update and its request model."""
    body = await parse_body(request, ScaleRequest)
    cache = _cluster(state)
    try:
        said = await cache.cluster.scale(name, body.replicas)
    except ConsoleRefused as err:
        raise _refused(err) from None
    cache.forget()
    return {"model": name, "replicas": body.replicas, "result": said}


class OllamaImportRequest(BaseModel):
    """`llmgw model import-ollama`'s NAME[:TAG], `--as MODEL` and `--mirror`."""

    model_config = ConfigDict(extra="forbid")

    reference: str = Field(min_length=1, max_length=300)
    name: str = Field(default="", max_length=63)  # "" : the Ollama name, as the CLI makes it
    mirror: bool = True


@api.post("/imports/ollama", dependencies=[Depends(require_same_site_json)])
async def import_ollama(request: Request, state: State) -> dict[str, Any]:
    """`llmgw model import-ollama`, started on the gateway's machine; its progress is in
    GET /console's `cluster.imports`."""
    body = await parse_body(request, OllamaImportRequest)
    cache = _cluster(state)
    try:
        said = await cache.cluster.import_ollama(
            body.reference.strip(), body.name.strip(), body.mirror
        )
    except ConsoleRefused as err:
        raise _refused(err) from None
    cache.forget()
    return {"reference": body.reference, "result": said}
