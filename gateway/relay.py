"""Relaying one upstream response to the client, and accounting for it exactly once.

A client that leaves cancels the upstream request: the engine sees its connection close and
stops generating (llama.cpp, vLLM and SGLang all abort a request whose client is gone). What it
produced until then is billed. After the first byte reached the client nothing is retried: a
stream that breaks ends with an error event and [DONE], never left hanging.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

import aiohttp
from starlette.types import Receive, Send

from gateway.deps import GatewayState
from gateway.errors import SERVER_ERROR, ApiError, error_body
from gateway.quota import Reservation
from gateway.sse import EventTooLarge, StreamFilter, data_event
from gateway.store import ApiKey
from workflows.contracts import Route

log = logging.getLogger(__name__)

SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
# Usage read out of a whole response without parsing it all: engines put it at the end.
_PROMPT_TOKENS = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


def usage_from_body(raw: bytes) -> tuple[int, int] | None:
    """(prompt, completion) tokens of a whole JSON response, None when it reports none."""
    at = raw.rfind(b'"usage"')
    if at < 0:
        return None
    tail = raw[at:]
    prompt = _PROMPT_TOKENS.search(tail)
    completion = _COMPLETION_TOKENS.search(tail)
    if prompt is None:
        return None
    return int(prompt.group(1)), int(completion.group(1)) if completion else 0


def usage_counts(usage: Any) -> tuple[int, int] | None:
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not isinstance(prompt, int):
        return None
    return prompt, completion if isinstance(completion, int) else 0


class Accounting:
    """Settles one request: usage row, quota, token metrics. The first call wins."""

    __slots__ = ("_done", "_key", "_model", "_prompt_estimate", "_reservation", "_state")

    def __init__(
        self,
        state: GatewayState,
        key: ApiKey,
        model: str,
        reservation: Reservation,
        prompt_estimate: int,
    ) -> None:
        self._state = state
        self._key = key
        self._model = model
        self._reservation = reservation
        self._prompt_estimate = prompt_estimate
        self._done = False

    def settle(self, counts: tuple[int, int] | None, chunks_seen: int = 0) -> None:
        if self._done:
            return
        self._done = True
        if counts is None:
            # The stream ended before the usage chunk (the client left, the engine died): the
            # prompt was processed, so its upper bound is billed, and a streamed chunk is about
            # one token. Over-counting here keeps a budget from being overrun, never the reverse.
            counts = (self._prompt_estimate, chunks_seen)
        prompt, completion = counts
        state = self._state
        state.usage.record(self._key.key_id, self._model, prompt, completion)
        state.metrics.tokens(self._model, prompt, completion)
        overrun = state.quota.settle(self._reservation, prompt + completion)
        if overrun:
            log.warning(
                "model %s used %d tokens more than reserved for key %s",
                self._model,
                overrun,
                self._key.key_id,
            )

    def settle_failed(self) -> None:
        """Nothing reached an engine: the request counts, its tokens do not."""
        if self._done:
            return
        self._done = True
        self._state.usage.record(self._key.key_id, self._model, 0, 0)
        self._state.quota.release(self._reservation)


class ClientWatch:
    """Cancels the request's handler when its client disconnects, so every await on the way to
    an engine (connecting, waiting for a plain answer, streaming) stops at once. Started once
    the body is read: from then on the next ASGI message can only be the disconnect, which
    uvicorn also sends after a complete response; hence `finished`."""

    def __init__(self, receive: Receive) -> None:
        self.gone = False
        self.finished = False
        handler = asyncio.current_task()
        assert handler is not None
        self._watcher = asyncio.create_task(self._watch(receive, handler))

    async def _watch(self, receive: Receive, handler: asyncio.Task[Any]) -> None:
        message = await receive()
        if message["type"] == "http.disconnect" and not self.finished:
            self.gone = True
            handler.cancel()

    def stop(self) -> None:
        self._watcher.cancel()


class Relay:
    def __init__(
        self,
        state: GatewayState,
        model: str,
        route: Route,
        upstream: aiohttp.ClientResponse,
        stream: bool,
        client_wants_usage: bool,
        watch: ClientWatch,
    ) -> None:
        self._watch = watch
        self._state = state
        self._model = model
        self._route = route
        self._upstream = upstream
        self._stream = stream and upstream.status == 200
        self._filter = StreamFilter(client_wants_usage)

    async def run(self, send: Send, accounting: Accounting, started: float) -> int:
        """Relay the response; returns the upstream's status (a client that left surfaces as a
        cancellation, which the caller records as 499). The upstream and the in-flight slot are
        released however this ends."""
        try:
            if self._stream:
                await self._relay_stream(send, accounting, started)
            else:
                await self._relay_whole(send, accounting)
        finally:
            self._upstream.close()
            self._state.inflight.release(self._route.replica_id)
            if self._stream:
                counted = self._filter.usage_filter
                usage = usage_counts(counted.usage)
                accounting.settle(usage, chunks_seen=counted.chunks)
            elif self._watch.gone:
                accounting.settle(None)  # the engine had the prompt when the client left
            else:
                accounting.settle_failed()  # a no-op once a good answer settled
        return self._upstream.status

    async def _relay_whole(self, send: Send, accounting: Accounting) -> None:
        upstream = self._upstream
        try:
            raw = await upstream.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            self._state.metrics.upstream_error(self._model, "broken")
            raise ApiError(
                502,
                "The model replica failed while answering.",
                type_=SERVER_ERROR,
                code="upstream_error",
            ) from exc
        status = upstream.status
        if status in (401, 403):
            # The engine refused the gateway's own key: a deployment fault, not the client's.
            log.error("replica %s refused the gateway's key (%d)", self._route.replica_id, status)
            self._state.metrics.upstream_error(self._model, "auth")
            raise ApiError(
                502,
                "The model replica refused the gateway's credentials.",
                type_=SERVER_ERROR,
                code="upstream_auth",
            )
        if 200 <= status < 300:
            accounting.settle(usage_from_body(raw) or (0, 0))
        content_type = upstream.headers.get("Content-Type", "application/json").encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", content_type),
                    (b"content-length", str(len(raw)).encode()),
                ],
            }
        )
        self._watch.finished = True
        await send({"type": "http.response.body", "body": raw})

    async def _relay_stream(self, send: Send, accounting: Accounting, started: float) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        stream_filter = self._filter
        first = True
        try:
            async for chunk in self._upstream.content.iter_any():
                out = stream_filter.feed(chunk)
                if not out:
                    continue
                if first:
                    first = False
                    self._state.metrics.first_token(self._model, time.perf_counter() - started)
                await send({"type": "http.response.body", "body": out, "more_body": True})
            rest = stream_filter.finish()
            if rest:
                await send({"type": "http.response.body", "body": rest, "more_body": True})
            if stream_filter.usage_filter.saw_done:
                self._watch.finished = True
                await send({"type": "http.response.body", "body": b""})
                return
            reason = "The model replica ended the stream early."
        except (TimeoutError, aiohttp.ClientError, EventTooLarge) as exc:
            log.warning("stream from replica %s broke: %r", self._route.replica_id, exc)
            reason = "The model replica failed while streaming."
        self._state.metrics.upstream_error(self._model, "stream_broken")
        self._watch.finished = True
        ending = data_event(error_body(reason, SERVER_ERROR, None, "upstream_stream_error"))
        await send({"type": "http.response.body", "body": ending + data_event(b"[DONE]")})
