"""The upstream hop: pick a replica, send the request with its engine key, relay the answer.

The client's own headers never travel upstream: the gateway builds the engine request from the
validated body and the replica's engine key only. A replica that cannot be reached before any
byte came back is swapped for another once; a stream that breaks after it started is ended for
the client with an error event, never left hanging.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.deps import GatewayState
from gateway.errors import SERVER_ERROR, ApiError, error_body
from gateway.request_body import CompletionRequest
from gateway.routing import RoutingSnapshot
from gateway.sse import EventTooLarge, SseSplitter, UsageFilter, data_event
from gateway.store import ApiKey
from workflows.contracts import Route

log = logging.getLogger(__name__)

RETRY_AFTER_S = "2"
# How often a held request looks for a ready replica of the model it woke.
WAKE_POLL_S = 0.2


def upstream_url(route: Route, path: str) -> str:
    """The ledger gives an endpoint such as http://10.0.0.5:18000 (a trailing /v1 or a missing
    scheme are tolerated); `path` starts with /v1/."""
    base = route.endpoint.rstrip("/")
    if "://" not in base:
        base = "http://" + base
    base = base.removesuffix("/v1")
    return base + path


def _usage_counts(usage: Any) -> tuple[int, int]:
    if not isinstance(usage, dict):
        return 0, 0
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (
        prompt if isinstance(prompt, int) else 0,
        completion if isinstance(completion, int) else 0,
    )


def _upstream_failure(message: str, code: str, status: int = 502) -> ApiError:
    return ApiError(status, message, type_=SERVER_ERROR, code=code)


async def proxy_completion(
    state: GatewayState, key: ApiKey, path: str, request: CompletionRequest
) -> Response:
    snapshot = state.routes.snapshot
    model = request.model
    if not snapshot.knows(model) and state.routes.last_success is None:
        # A gateway that has not read the routing table yet cannot say a model does not exist.
        raise ApiError(
            503,
            "The gateway is still loading its routing table; try again shortly.",
            type_=SERVER_ERROR,
            code="routes_not_loaded",
            headers={"Retry-After": RETRY_AFTER_S},
        )
    if not snapshot.knows(model):
        raise ApiError(
            404, f"The model '{model}' does not exist.", param="model", code="model_not_found"
        )
    cold_start = state.settings.cold_start_timeout_s
    if not snapshot.ready(model) and (
        snapshot.is_idle(model) or state.routes.warming(model, cold_start)
    ):
        snapshot = await wait_for_replica(state, model, cold_start)
    body = dict(request.body)
    if request.stream:
        # Always ask for usage, so a streamed request is accounted like any other.
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    payload = json.dumps(body, separators=(",", ":")).encode()

    tried: list[str] = []
    last_error: Exception | None = None
    for _ in range(2):
        route = snapshot.pick(model, state.inflight.counts, exclude=tried)
        dropped = isinstance(last_error, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError)
        refused = isinstance(last_error, aiohttp.ClientConnectorError)
        if route is None and dropped and not refused and tried:
            # No other replica, and the first one only dropped a pooled connection: that
            # replica is likely fine, so it gets the one retry.
            route = next((r for r in snapshot.ready(model) if r.replica_id == tried[-1]), None)
        if route is None:
            break
        state.inflight.acquire(route.replica_id)
        try:
            upstream = await state.session.post(
                upstream_url(route, path),
                data=payload,
                headers={
                    "Authorization": f"Bearer {state.engine_keys.for_route(route)}",
                    "Content-Type": "application/json",
                    "Accept": "text/event-stream" if request.stream else "application/json",
                },
            )
        except (
            # ClientOSError covers a refused connection (ClientConnectorError) and a pooled
            # connection reset by an engine killed since: both fail before a byte came back.
            aiohttp.ClientOSError,
            aiohttp.ConnectionTimeoutError,
            aiohttp.ServerDisconnectedError,
        ) as exc:
            state.inflight.release(route.replica_id)
            log.warning("replica %s unreachable: %s", route.replica_id, exc)
            tried.append(route.replica_id)
            last_error = exc
            continue
        except TimeoutError as exc:
            state.inflight.release(route.replica_id)
            raise _upstream_failure(
                "The model replica did not answer in time.", "upstream_timeout", 504
            ) from exc
        except BaseException:
            state.inflight.release(route.replica_id)
            raise
        relay = _Relay(state, key, model, route, upstream, request.wants_usage)
        if request.stream and upstream.status == 200:
            return relay.streaming_response()
        return await relay.whole_response()

    if last_error is None:
        raise ApiError(
            503,
            f"The model '{model}' has no ready replica right now; try again shortly.",
            type_=SERVER_ERROR,
            param="model",
            code="no_ready_replica",
            headers={"Retry-After": RETRY_AFTER_S},
        )
    raise _upstream_failure(
        f"No replica of the model '{model}' could be reached.", "upstream_unreachable"
    )


async def wait_for_replica(state: GatewayState, model: str, timeout_s: float) -> RoutingSnapshot:
    """Hold a request for a model at zero replicas: wake it, then wait for the routing table to
    show a ready replica (it refreshes in the background), up to the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        await state.routes.wake(model)
        snapshot = state.routes.snapshot
        if snapshot.ready(model):
            return snapshot
        if loop.time() >= deadline:
            raise ApiError(
                503,
                f"The model '{model}' is starting from zero replicas; try again shortly.",
                type_=SERVER_ERROR,
                param="model",
                code="model_starting",
                headers={"Retry-After": RETRY_AFTER_S},
            )
        await asyncio.sleep(WAKE_POLL_S)


class _Relay:
    """Owns one upstream response: releases it, the in-flight slot and records usage exactly
    once, however the client side ends."""

    def __init__(
        self,
        state: GatewayState,
        key: ApiKey,
        model: str,
        route: Route,
        upstream: aiohttp.ClientResponse,
        client_wants_usage: bool,
    ) -> None:
        self._state = state
        self._key = key
        self._model = model
        self._route = route
        self._upstream = upstream
        self._filter = UsageFilter(client_wants_usage=client_wants_usage)
        self._closed = False

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._upstream.close()
        self._state.inflight.release(self._route.replica_id)

    def _record(self, usage: Any, fallback_completion: int = 0) -> None:
        prompt, completion = _usage_counts(usage)
        if usage is None:
            # The stream ended before the usage chunk (the client left, or the engine died):
            # one chunk is about one token, a better count than none.
            completion = fallback_completion
        self._state.usage.record(self._key.key_id, self._model, prompt, completion)

    async def whole_response(self) -> Response:
        try:
            raw = await self._upstream.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise _upstream_failure(
                "The model replica failed while answering.", "upstream_error"
            ) from exc
        finally:
            await self.close()
        status = self._upstream.status
        if status in (401, 403):
            # The engine refused the gateway's own key: a deployment fault, not the client's.
            log.error("replica %s refused the engine key (%d)", self._route.replica_id, status)
            raise _upstream_failure(
                "The model replica refused the gateway's credentials.", "upstream_auth"
            )
        try:
            parsed = json.loads(raw)
        except ValueError:
            raise _upstream_failure(
                f"The model replica answered {status} with a body that is not JSON.",
                "upstream_error",
            ) from None
        if 200 <= status < 300 and isinstance(parsed, dict):
            self._record(parsed.get("usage"))
        return Response(content=raw, status_code=status, media_type="application/json")

    def streaming_response(self) -> Response:
        return _ClosingStreamingResponse(
            self._events(),
            on_close=self._finish_stream,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def _finish_stream(self) -> None:
        if not self._closed:
            self._record(self._filter.usage, fallback_completion=self._filter.chunks)
        await self.close()

    async def _events(self) -> AsyncIterator[bytes]:
        splitter = SseSplitter()
        try:
            async for chunk in self._upstream.content.iter_any():
                for event in splitter.feed(chunk):
                    out = self._filter.process(event)
                    if out is not None:
                        yield out
            rest = splitter.rest()
            if rest:
                out = self._filter.process(rest)
                if out is not None:
                    yield out
            if self._filter.saw_done:
                return
            reason = "The model replica ended the stream early."
        except (TimeoutError, aiohttp.ClientError, EventTooLarge) as exc:
            log.warning("stream from replica %s broke: %r", self._route.replica_id, exc)
            reason = "The model replica failed while streaming."
        yield data_event(error_body(reason, SERVER_ERROR, None, "upstream_stream_error"))
        yield data_event(b"[DONE]")


class _ClosingStreamingResponse(StreamingResponse):
    """A StreamingResponse that runs `on_close` however it ends: finished, client gone, or
    cancelled before the first chunk (when the body generator would never run its finally)."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        on_close: Callable[[], Awaitable[None]],
        media_type: str,
        headers: dict[str, str],
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()
