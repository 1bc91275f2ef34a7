"""One request to one engine: its URL, its key, the timers that bound the wait for the answer
to start, and which failures mean the engine dropped a connection it had accepted."""

from __future__ import annotations

import asyncio
import errno
import functools
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp

from gateway.deps import GatewayState
from gateway.request_body import ProxiedRequest
from gateway.upstream_http import UpstreamConnectError
from workflows.contracts import Route

# How far a request's remaining deadline may fall short of the upstream read timeout and still be
# left to that timeout (no timer of the request's own): at most this long, and this share of it.
DEADLINE_SLACK_S = 1.0
DEADLINE_SLACK_SHARE = 0.01


class UpstreamBody(Protocol):
    def iter_any(self) -> AsyncIterator[bytes]: ...
    def at_eof(self) -> bool: ...


class UpstreamResponse(Protocol):
    """What the relay reads of an engine's answer: aiohttp's ClientResponse (https) or the
    gateway's own client's (gateway/upstream_http.py). Header names in lower case."""

    @property
    def status(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def content(self) -> UpstreamBody: ...
    async def read(self) -> bytes: ...
    def close(self) -> None: ...
    def release(self) -> Any: ...


def upstream_url(route: Route, path: str) -> str:
    """The ledger gives an endpoint such as http://10.0.0.5:18000 (a trailing /v1 or a missing
    scheme are tolerated); `path` starts with / (/v1/..., or an engine's metrics path)."""
    return upstream_url_of(route.endpoint) + path


def needs_own_timer(remaining: float, read_timeout: float) -> bool:
    """Whether waiting for a replica's answer needs a timer of the request's own, or whether
    the session's read timeout ends it no later than the deadline would, give or take the
    slack. With the defaults (both 600 s) the deadline left is the read timeout less the time
    spent admitting the request: the slack spares that case a timer per request."""
    return remaining < read_timeout - min(DEADLINE_SLACK_S, read_timeout * DEADLINE_SLACK_SHARE)


@functools.lru_cache(maxsize=4096)
def plain_http_address(endpoint: str) -> tuple[str, int, str, str] | None:
    """(host, port, Host header, path prefix) of an endpoint on plain http, for the gateway's
    own client (gateway/upstream_http.py); None for https, which aiohttp's session serves."""
    parts = urlsplit(upstream_url_of(endpoint))
    if parts.scheme != "http" or parts.hostname is None:
        return None
    return parts.hostname, parts.port or 80, parts.netloc, parts.path


def upstream_url_of(endpoint: str) -> str:
    base = endpoint.rstrip("/")
    if "://" not in base:
        base = "http://" + base
    return base.removesuffix("/v1")


async def post_upstream(
    state: GatewayState,
    route: Route,
    request: ProxiedRequest,
    payload: bytes,
    remaining: float,
    trace_headers: dict[str, str] | None = None,
) -> UpstreamResponse:
    """POST one request to `route`'s engine with its key; returns once the response starts.
    `trace_headers`: the attempt's trace context (gateway/tracing.py), when the gateway traces."""
    headers = {
        "Content-Type": "application/json",
        "Accept": "text/event-stream" if request.stream else "application/json",
    }
    if trace_headers:
        headers.update(trace_headers)
    secret = state.upstream_auth(route)
    if secret:
        headers["Authorization"] = f"Bearer {secret}"
    own_timer = needs_own_timer(remaining, state.settings.upstream_read_timeout_s)
    address = plain_http_address(route.endpoint)
    if address is not None:
        host, port, host_header, prefix = address
        path = prefix + request.path
        if not own_timer:
            return await state.upstream.post(host, port, host_header, path, headers, payload)
        async with asyncio.timeout(remaining):
            connect_s = min(state.settings.upstream_connect_timeout_s, remaining)
            return await state.upstream.post(
                host, port, host_header, path, headers, payload, connect_s
            )
    url = upstream_url(route, request.path)
    if not own_timer:
        # The usual case: the session's own timeouts bound the wait.
        return await state.session.post(url, data=payload, headers=headers)
    # Until the response starts: bounded by the request's deadline, so a hung replica still
    # leaves time to try another. Reads after that follow the session's read timeout.
    timeout = aiohttp.ClientTimeout(
        total=None,
        sock_connect=min(state.settings.upstream_connect_timeout_s, remaining),
        sock_read=state.settings.upstream_read_timeout_s,
    )
    async with asyncio.timeout(remaining):
        return await state.session.post(url, data=payload, headers=headers, timeout=timeout)


def closed_before_answering(exc: BaseException) -> bool:
    """Whether the engine closed or reset a connection it had accepted, before any answer: what a
    request written onto a pooled connection the engine was closing looks like. A refused
    connection is not this: nothing listens there."""
    if isinstance(exc, aiohttp.ClientConnectorError | UpstreamConnectError):
        return False
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientConnectionResetError):
        return True
    return isinstance(exc, aiohttp.ClientOSError) and exc.errno in (errno.ECONNRESET, errno.EPIPE)
