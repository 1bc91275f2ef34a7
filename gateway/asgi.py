"""Raw ASGI plumbing for the hot path: reading a bounded body, sending JSON and errors.

The proxied routes skip FastAPI's routing, dependency injection and response classes: measured,
they cost more per request than the upstream hop itself (docs/benchmarks-history.md, Gateway,
2026-11-30).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, MutableMapping
from typing import Any

from starlette.types import Message, Receive, Send

from gateway.errors import ApiError
from gateway.request_body import too_large

JSON_HEADERS = [(b"content-type", b"application/json")]


def headers_of(scope: MutableMapping[str, Any], wanted: frozenset[bytes]) -> dict[bytes, bytes]:
    """The wanted request headers (names lower-case, as ASGI gives them); the first wins."""
    found: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        if name in wanted and name not in found:
            found[name] = value
    return found


async def read_body(receive: Receive, max_bytes: int, declared: bytes | None) -> bytes:
    """The whole request body, refused with 413 as soon as it is known to exceed `max_bytes`:
    from Content-Length before reading anything, else while it streams in."""
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise too_large(max_bytes)
    message = await receive()
    _check_not_cut(message)
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        return body  # the usual case: one message, no copy
    parts = [body]
    size = len(body)
    while message.get("more_body", False):
        message = await receive()
        _check_not_cut(message)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise too_large(max_bytes)
        parts.append(chunk)
    return b"".join(parts)


def _check_not_cut(message: Message) -> None:
    # A connection dropped mid-body (or refused by the parser mid-body) ends with a disconnect,
    # not with more_body=False: what arrived so far must never be taken for the whole request.
    if message["type"] == "http.disconnect":
        raise ApiError(400, "The request body was cut short.", code="incomplete_body")


async def send_bytes(
    send: Send,
    status: int,
    body: bytes,
    headers: Iterable[tuple[bytes, bytes]] = JSON_HEADERS,
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, error: ApiError) -> None:
    extra = [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send_bytes(send, error.status, json.dumps(error.body()).encode(), JSON_HEADERS + extra)
