"""A small read-only admin API for the operator on the gateway's own machine.

It answers only to loopback clients, and only when the Host header is an address or localhost:
the second check stops a web page from reaching it through DNS rebinding (a hostile name that
resolves to 127.0.0.1 still sends its own name as Host).
"""

from __future__ import annotations

import ipaddress
from datetime import date
from typing import Any

from fastapi import APIRouter, Depends, Request

from gateway.deps import State
from gateway.errors import ApiError

LOOPBACK_CLIENTS = frozenset({"127.0.0.1", "::1"})


def _host_name(host_header: str) -> str:
    if host_header.startswith("["):  # [::1]:8080
        return host_header[1:].partition("]")[0]
    if host_header.count(":") == 1:
        return host_header.partition(":")[0]
    return host_header


def _is_address_or_localhost(host_header: str) -> bool:
    name = _host_name(host_header.strip()).lower()
    if name == "localhost":
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def require_local(request: Request) -> None:
    client = request.client.host if request.client else ""
    host = request.headers.get("host", "")
    if client not in LOOPBACK_CLIENTS or not _is_address_or_localhost(host):
        raise ApiError(
            403,
            "The admin API answers only to local clients.",
            type_="permission_error",
            code="admin_local_only",
        )


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


@router.get("/usage")
async def usage(
    state: State,
    key_id: str | None = None,
    model: str | None = None,
    since: date | None = None,  # a UTC day, YYYY-MM-DD
) -> dict[str, Any]:
    rows = await state.store.usage(key_id=key_id, model=model, since=since)
    return {"data": [row.model_dump(mode="json") for row in rows]}
