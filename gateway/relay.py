"""Relaying one upstream response to the client, and accounting for it exactly once.

A client that leaves cancels the upstream request: the engine sees its connection close and
stops generating (llama.cpp, vLLM and SGLang all abort a request whose client is gone). What it
produced until then is billed. After the first byte reached the client nothing is retried: a
stream that breaks ends with an error event and [DONE], never left hanging.

A streaming client that stops reading is treated the same way: each write to it must complete
within `stream_write_timeout_s`, or its connection is dropped, the upstream response closed (so
the engine stops) and what was streamed billed. uvicorn's `send` waits while the connection's
write buffer is above its high-water mark, so a write that does not complete is a client that
does not read, and the gateway holds at most that buffer (plus one chunk) for it meanwhile.

What is billed, every choice counted, is worked out in gateway/billing.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import struct
import time
from typing import Any, Protocol

import aiohttp
from starlette.types import Receive, Send

from gateway.billing import stream_counts, whole_response_counts, with_usage
from gateway.deps import GatewayState
from gateway.errors import SERVER_ERROR, ApiError, error_body
from gateway.http_limits import watch_client
from gateway.observe.record import RequestRecord
from gateway.quota import Reservation
from gateway.routing import Sent
from gateway.routing.states import Expected, reported_cached
from gateway.sse import EventTooLarge, StreamFilter, data_event
from gateway.upstream_post import UpstreamResponse
from store import ApiKey
from workflows.contracts import Route

log = logging.getLogger(__name__)

SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class Accounting:
    """Settles one request: usage row, quota, token metrics. The first call wins."""

    __slots__ = (
        "_done",
        "_key",
        "_model",
        "_prompt_estimate",
        "_reservation",
        "_state",
        "record",
        "used",
    )

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
        # The tokens the request was settled with (prompt plus completion): what the fair queue
        # charges its key. None until settled, and when nothing reached an engine.
        self.used: int | None = None
        # The request log's record (gateway/observe/), told the tokens settled; None: log off.
        self.record: RequestRecord | None = None

    @property
    def reservation(self) -> Reservation:
        return self._reservation

    @property
    def prompt_estimate(self) -> int:
        return self._prompt_estimate

    def settle(self, counts: tuple[int, int] | None, chunks_seen: int = 0) -> None:
        if self._done:
            return
        self._done = True
        estimated = counts is None
        if counts is None:
            # The stream ended before the usage chunk (the client left, the engine died): the
            # prompt was processed, so its upper bound is billed, and a streamed chunk is about
            # one token. Over-counting here keeps a budget from being overrun, never the reverse.
            counts = (self._prompt_estimate, chunks_seen)
        prompt, completion = counts
        self.used = prompt + completion
        state = self._state
        if state.tracing is not None:
            state.tracing.settled(prompt, completion, estimated)
        if self.record is not None:
            self.record.prompt_tokens = prompt
            self.record.completion_tokens = completion
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
    the body is read. Under the gateway's own protocol the connection tells it
    (gateway/http_limits.py `watch_client`); under another ASGI server a task waits for the
    next ASGI message, which can then only be the disconnect, and which uvicorn also sends
    after a complete response; hence `finished`."""

    def __init__(self, receive: Receive) -> None:
        self.gone = False
        self.finished = False
        # The connection's transport, for a stream to drop a client that stopped reading.
        self.transport = transport_of(receive)
        self._watcher: asyncio.Task[None] | None = None
        self._unwatch = watch_client(receive, self._client_gone)
        if self._unwatch is None:
            handler = asyncio.current_task()
            assert handler is not None
            self._watcher = asyncio.create_task(self._watch(receive, handler))

    async def _watch(self, receive: Receive, handler: asyncio.Task[Any]) -> None:
        message = await receive()
        if message["type"] == "http.disconnect" and self._client_gone():
            handler.cancel()

    def _client_gone(self) -> bool:
        """Whether the handler is to be cancelled: its client left before its response
        finished."""
        if self.finished:
            return False
        self.gone = True
        return True

    def stop(self) -> None:
        if self._unwatch is not None:
            self._unwatch()
        if self._watcher is not None:
            self._watcher.cancel()


# What the request metrics record for a stream whose client was dropped for not reading:
# nginx's "client closed request", as for a client that left (gateway/proxy.py).
CLIENT_DROPPED = 499
# The connection's write buffer while it streams: uvicorn's `send` waits while more than HIGH
# bytes are queued, until fewer than LOW are. asyncio's and uvloop's defaults, stated here so
# the bound on what a non-reading client costs the gateway is ours: HIGH plus the one chunk
# being written (what the upstream client had buffered: up to 128 KiB and one read more, both for
# gateway/upstream_http.py's READ_BUFFER_HIGH and aiohttp's buffer on https). The kernel's socket
# buffers come on top, sized by the OS.
STREAM_BUFFER_HIGH = 64 * 1024
STREAM_BUFFER_LOW = 16 * 1024
# How long ending a dropped connection's response may wait for uvicorn to notice the drop.
_DROP_SETTLE_S = 1.0


class ClientTooSlow(Exception):
    """A streaming client did not take a write within the stream write timeout."""


class _Abortable(Protocol):
    def abort(self) -> None: ...
    def get_extra_info(self, name: str, default: Any = None) -> Any: ...
    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None: ...
    def get_write_buffer_size(self) -> int: ...


def transport_of(channel: object) -> _Abortable | None:
    """The client connection's transport, or None when `channel` does not expose it. ASGI offers
    no way to drop a connection, and a graceful close would keep it open until the client read
    everything queued. uvicorn's `receive` and `send` are methods of the request's cycle, which
    holds the transport; `receive` is taken, since middleware wraps `send` (front_door.py)."""
    transport = getattr(getattr(channel, "__self__", None), "transport", None)
    kind = type(transport)
    if kind in _ABORTABLE:
        return transport
    if all(
        callable(getattr(transport, name, None))
        for name in ("abort", "set_write_buffer_limits", "get_write_buffer_size")
    ):
        _ABORTABLE.add(kind)  # a class's methods stay: asked once per class, not per request
        return transport
    return None


_ABORTABLE: set[type] = set()


def reset(transport: _Abortable) -> None:
    """Close the connection with a reset, discarding what is queued for it. A plain close, even
    an abort, lets the kernel keep delivering its socket buffer (megabytes, at the client's pace)
    after the gateway lets go; a zero linger time makes the close a reset."""
    sock = transport.get_extra_info("socket")
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class Relay:
    def __init__(
        self,
        state: GatewayState,
        model: str,
        route: Route,
        upstream: UpstreamResponse,
        stream: bool,
        client_wants_usage: bool,
        watch: ClientWatch,
        predicted_cached: int | None = None,
        sent: Sent | None = None,
        expected: Expected | None = None,
    ) -> None:
        """`predicted_cached`: the prompt tokens the router expected the engine to find in its
        cache (KV events), checked against what the engine reports; None: nothing to check.
        `sent`: the request as the router noted it sent (Router.sent), told when the engine
        started it and when it finished. `expected`: what the decision predicted the replica
        holds, for the incorrect-routing rate (gateway/routing/states.py); None: nothing."""
        self._watch = watch
        self._predicted_cached = predicted_cached
        self._expected = expected
        self._sent = sent
        self._state = state
        self._model = model
        self._route = route
        self._upstream = upstream
        # A stream's filter; None for a whole answer (or an error's), which reads its usage
        # from the body and has no use for one.
        self._filter = (
            StreamFilter(client_wants_usage) if stream and upstream.status == 200 else None
        )
        self._record: RequestRecord | None = None  # the request log's, from `run`'s accounting

    async def run(self, send: Send, accounting: Accounting, started: float) -> int:
        """Relay the response; returns the upstream's status (a client that left surfaces as a
        cancellation, which the caller records as 499; a client dropped for not reading returns
        499 itself). The upstream and the in-flight slot are released however this ends."""
        reservation = accounting.reservation
        self._record = accounting.record
        stream_filter = self._filter
        if stream_filter is not None and reservation.choices > 1:
            # Several choices: count them as they stream, since the engine may report fewer.
            counted = stream_filter.usage_filter
            counted.count_choices = True
            # The client's usage chunk says what is billed (gateway/sse.py).
            counted.billed = functools.partial(stream_counts, reservation=reservation)
        dropped = False
        try:
            if stream_filter is not None:
                try:
                    await self._relay_stream(send, started, stream_filter)
                except ClientTooSlow:
                    dropped = True
            else:
                await self._relay_whole(send, accounting)
        finally:
            # Closing the upstream response closes its connection: the engine sees its client
            # gone and stops generating, before the dropped client is dealt with below.
            self._upstream.close()
            self._state.inflight.release(self._route.replica_id)
            self._state.router.finished(self._sent)
            if stream_filter is not None:
                counted = stream_filter.usage_filter
                accounting.settle(stream_counts(counted, reservation), chunks_seen=counted.chunks)
                details = (counted.usage or {}).get("prompt_tokens_details")
                if isinstance(details, dict):
                    self._cached(details.get("cached_tokens"))
            elif self._watch.gone:
                accounting.settle(None)  # the engine had the prompt when the client left
            else:
                accounting.settle_failed()  # a no-op once a good answer settled
        if dropped:
            await self._drop_client(send)
            return CLIENT_DROPPED
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
            counts = whole_response_counts(
                raw, self._route.engine, accounting.reservation, accounting.prompt_estimate
            )
            accounting.settle(counts)
            if accounting.reservation.choices > 1:
                # Several choices: the answer's usage says what was billed, as OpenAI's does.
                raw = with_usage(raw, counts)
            if (
                self._predicted_cached is not None
                or self._expected is not None
                or self._record is not None
            ):
                self._cached(reported_cached(raw))
        content_type = upstream.headers.get("content-type", "application/json").encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", content_type),
                    (b"content-length", str(len(raw)).encode()),
                    *(() if self._record is None else (self._record.header(),)),
                ],
            }
        )
        self._watch.finished = True
        await send({"type": "http.response.body", "body": raw})

    def _cached(self, reported: object) -> None:
        """The engine reported `reported` cached prompt tokens (vLLM does with
        --enable-prompt-tokens-details, llama-server in its usage since early 2026): how far
        the router's prediction was off, and whether the replica held the prefix at all."""
        if not isinstance(reported, int) or isinstance(reported, bool) or reported < 0:
            return
        if self._predicted_cached is not None:
            self._state.metrics.kv_cache_error(self._model, self._predicted_cached, reported)
        if self._expected is not None:
            self._state.metrics.routing_checked(self._model, self._expected, reported)
        if self._state.tracing is not None:
            self._state.tracing.cached(reported)
        if self._record is not None:
            self._record.cached_tokens = reported

    async def _relay_stream(self, send: Send, started: float, stream_filter: StreamFilter) -> None:
        transport = self._watch.transport
        if transport is not None:
            transport.set_write_buffer_limits(high=STREAM_BUFFER_HIGH, low=STREAM_BUFFER_LOW)
        headers = SSE_HEADERS if self._record is None else [*SSE_HEADERS, self._record.header()]
        await self._send(send, {"type": "http.response.start", "status": 200, "headers": headers})
        counted = stream_filter.usage_filter
        upstream = self._upstream.content
        first = True
        last = b""  # the end of the stream, sent as the end of the response
        try:
            # iter_any hands over everything aiohttp has buffered at once: a client that keeps
            # up gets one write per upstream read, however many events it holds.
            async for chunk in upstream.iter_any():
                out = stream_filter.feed(chunk)
                if not out:
                    continue
                if first:
                    first = False
                    ttft = time.perf_counter() - started
                    self._state.metrics.first_token(self._model, ttft)
                    if self._state.tracing is not None:
                        self._state.tracing.first_token(ttft)
                    if self._record is not None:
                        self._record.ttft_s = ttft
                    self._state.router.started(self._sent)
                if counted.saw_done and upstream.at_eof():
                    # [DONE], an engine's last event, came in the read that ended the upstream
                    # response (with its chunked terminator): it ends the client's response in
                    # the same write, one write less per stream.
                    last = out
                    break
                message = {"type": "http.response.body", "body": out, "more_body": True}
                # `_send`, its usual case written out: a client that keeps up costs no
                # coroutine per write (one write per upstream read).
                if transport is not None and transport.get_write_buffer_size() <= STREAM_BUFFER_LOW:
                    await send(message)
                else:
                    await self._send_timed(send, message)
            # An event the stream ended without its blank line, if any.
            last += stream_filter.finish()
            if counted.saw_done:
                self._watch.finished = True
                await self._send(send, {"type": "http.response.body", "body": last})
                return
            reason = "The model replica ended the stream early."
        except (TimeoutError, aiohttp.ClientError, EventTooLarge) as exc:
            log.warning("stream from replica %s broke: %r", self._route.replica_id, exc)
            reason = "The model replica failed while streaming."
        self._state.metrics.upstream_error(self._model, "stream_broken")
        self._watch.finished = True
        ending = data_event(error_body(reason, SERVER_ERROR, None, "upstream_stream_error"))
        await self._send(
            send, {"type": "http.response.body", "body": last + ending + data_event(b"[DONE]")}
        )

    async def _send(self, send: Send, message: dict[str, Any]) -> None:
        """One write to a streaming client, which must complete within the write timeout:
        uvicorn's send only waits while the connection's buffer is full, so a write that does
        not complete is a client that has not read for that long.

        The timer is set only when the write may wait: a transport pauses its writer once more
        than STREAM_BUFFER_HIGH bytes are queued and resumes it once no more than
        STREAM_BUFFER_LOW are, so with LOW or fewer queued uvicorn's send returns without
        awaiting. A client that keeps up (the usual case) then costs no timer per write."""
        transport = self._watch.transport
        if transport is not None and transport.get_write_buffer_size() <= STREAM_BUFFER_LOW:
            await send(message)
            return
        await self._send_timed(send, message)

    async def _send_timed(self, send: Send, message: dict[str, Any]) -> None:
        """A write that may wait: it must complete within the write timeout."""
        try:
            async with asyncio.timeout(self._state.settings.stream_write_timeout_s):
                await send(message)
        except TimeoutError:
            raise ClientTooSlow from None

    async def _drop_client(self, send: Send) -> None:
        """Cut the connection of a client that stopped reading, discarding what is queued."""
        # The disconnect that follows is the gateway's doing: the watch must not cancel the
        # handler for it.
        self._watch.finished = True
        timeout = self._state.settings.stream_write_timeout_s
        log.warning(
            "dropped a streaming client of %s that read nothing for %gs", self._model, timeout
        )
        transport = self._watch.transport
        if transport is None:
            return  # the server closes a connection whose response did not complete
        reset(transport)
        # uvicorn hears of the abort on the loop's next turn and from then on ignores sends;
        # ending the response waits for that, so no incomplete response is reported.
        with contextlib.suppress(Exception):
            async with asyncio.timeout(_DROP_SETTLE_S):
                await send({"type": "http.response.body", "body": b""})
