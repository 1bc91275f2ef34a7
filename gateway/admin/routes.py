"""The admin API's gate, its view of the routing table (GET /admin/v1/routes) and of the KV
feeds and external engines' KV-event publishers (GET /admin/v1/kv); keys, models and usage have
routers of their own (admin/keys.py, admin/models.py, admin/usage.py).

Every admin router depends on `require_local`, which applies all of gateway/admin/guard.py's
rules: loopback clients only, Host an address or localhost (DNS rebinding), nothing a browser
marks cross-site, and changes only as application/json.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from gateway.admin.guard import check_admin_request
from gateway.deps import State


def require_local(request: Request) -> None:
    """The admin API's gate, on every admin router: reads as well as changes (a cross-site page
    must not read usage or routes either)."""
    client = request.client.host if request.client else None
    check_admin_request(request.method, client, request.headers)


router = APIRouter(prefix="/admin/v1", dependencies=[Depends(require_local)])


@router.get("/routes")
async def routes(state: State) -> dict[str, Any]:
    refresher = state.routes
    table = refresher.snapshot.table
    return {
        "version": table.version,
        "age_s": refresher.age_s(),
        "last_error": refresher.last_error,
        "inflight": dict(state.inflight.counts),
        "routes": [route.model_dump(mode="json") for route in table.routes],
    }


@router.get("/kv")
async def kv(state: State) -> dict[str, Any]:
    """Each node agent's KV feed as this gateway reads it (connected, epoch, last seq, counts),
    the blocks it holds per replica (gateway/kv/feeds.py), and each external engine's publisher
    it subscribes to (gateway/kv/publishers.py)."""
    return {**state.kv_feeds.describe(), "publishers": state.kv_publishers.describe()}
