"""Bounds uvicorn's httptools protocol does not set, for a gateway that faces hostile clients.

Found by reading uvicorn's httptools_impl (0.54) and trying it: llhttp already refuses request
smuggling (Content-Length with Transfer-Encoding, a repeated Content-Length, a bad chunk size,
an unknown transfer coding) with a 400 and a closed connection, and uvicorn closes a keep-alive
connection idle for `timeout_keep_alive`. What it leaves open, and this subclass closes:

- Size of the request head. uvicorn appends the URL and every header to Python buffers with no
  limit, and httptools joins the pieces of one long header with `bytes +=`, quadratic in its
  length. The head (request line and headers) is fed to the parser at most `max_head_bytes` at
  a time, and a head still unfinished after that is refused: 414 for a long URL, 431 otherwise.
- Time to send the head. No timer runs from a connection's opening, or from the first byte of a
  request, until its headers end: a client trickling a byte a second (slowloris) held a
  connection, a task slot and a file descriptor forever. Now the whole head must arrive within
  `head_timeout_s`, however it is spread out.
- Time to send the body, likewise (`body_timeout_s` from the end of the head).
- Size of the body. A declared Content-Length above `max_body_bytes` is refused with 413 before
  the application runs or a byte of the body is read; a chunked body is counted as it arrives.
  The application counts too (gateway/request_body.py), so the count here is a backstop set a
  little higher, for handlers that read a whole body without counting.
- Answering before the body is read (413, 401): uvicorn kept the connection and read the rest of
  the body, however large, to find the next request. The connection is now half-closed after the
  answer and the rest discarded for a moment ("lingering close", as nginx does: closing at once
  would reset the connection, and a client still sending could lose the answer), then closed.
  The answer says `connection: close`, so a keep-alive client (httpx, the `openai` client) does
  not send its next request on a connection that is closing: it did, when the body arrived a
  moment after the head, and lost that request to "Server disconnected".
- An HTTP/1.0 request with Transfer-Encoding (which HTTP/1.0 does not have) was read as chunked,
  served, and its connection closed, dropping what was pipelined behind it unanswered. It is
  refused with 400 (RFC 9112 6.1: its framing is faulty).
- Trailer fields of a chunked body were appended to the request's headers, after the
  application had read them. They are dropped (RFC 9110 §6.5.1), and counted against the head.

Refusals made here carry the same OpenAI-shaped JSON error body as the application's.

Besides the bounds, the protocol tells a request's handler when its client leaves
(`watch_client`, used by gateway/relay.py's ClientWatch), so no task per request has to wait on
ASGI's `receive` for the disconnect.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, cast

import httptools
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from gateway.errors import error_body
from gateway.response_cycle import ResponseCycle

MIB = 1024 * 1024


@dataclass(frozen=True)
class HttpLimits:
    # nginx's defaults are an 8 KiB line and 32 KiB of headers; OpenAI clients send under 2 KiB.
    max_url_bytes: int = 8 * 1024
    max_head_bytes: int = 32 * 1024
    max_headers: int = 100
    max_body_bytes: int = 16 * MIB
    # The application refuses bodies past max_body_bytes itself; this much more is allowed
    # through before the protocol steps in, so a counting handler always answers first.
    body_backstop_slack_bytes: int = MIB
    # Request heads are small and clients are programs: a few seconds is generous, and it is
    # what a slowloris connection holds at most.
    head_timeout_s: float = 5.0
    # 16 MiB in a minute is 280 KB/s; a request body slower than that is not a client we serve.
    body_timeout_s: float = 60.0
    # How long a refused body is read and discarded so the answer is not lost to a reset.
    linger_s: float = 2.0


class _Refusal(Exception):
    """Raised inside a parser callback to stop parsing; answered by data_received."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


def error_response(status: int, message: str, code: str) -> bytes:
    """A complete response that closes the connection, written outside the application."""
    body = json.dumps(error_body(message, code=code)).encode()
    return b"".join(
        [
            STATUS_LINE[status],
            b"content-type: application/json\r\n",
            b"content-length: " + str(len(body)).encode() + b"\r\n",
            b"connection: close\r\n",
            b"\r\n",
            body,
        ]
    )


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the bounds above; `limited_protocol` makes the class
    with its limits set, as uvicorn takes a class for `http=`."""

    limits: ClassVar[HttpLimits] = HttpLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # reading a request line and headers (or waiting for one)
        self._head_bytes = 0  # fed to the parser since this head began
        self._header_count = 0
        self._trailer_bytes = 0
        self._body_bytes = 0
        self._body_raw_bytes = 0  # body as sent, chunk framing included
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        # A request head begun and not ended, a body awaited: their timers are armed once the
        # data at hand is parsed, so a request that arrives whole in one read arms none.
        self._head_begun = False
        self._body_awaited = False
        self._linger_timer: asyncio.TimerHandle | None = None
        self._lingering = False
        # The request answered before its body was read: its connection closes after the answer.
        self._answered_early: RequestResponseCycle | None = None
        # The request whose handler is told when its client leaves (`watch_client`), the
        # handler's task, and what to ask before cancelling it.
        self._watched: RequestResponseCycle | None = None
        self._handler: asyncio.Task[Any] | None = None
        self._on_gone: Callable[[], bool] | None = None

    # --- connection -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # A connection that never sends a byte is a slowloris too.
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)
        self._tell_gone()

    # --- the client leaving -----------------------------------------------------------

    def watch(self, cycle: RequestResponseCycle, on_gone: Callable[[], bool]) -> Callable[[], None]:
        """Called from the task handling `cycle`: if the connection is lost before the response
        completes, call `on_gone` once, and cancel that task if it answers True. The function
        returned stops watching."""
        # With the loop given, not looked up: asyncio's lookup asks the kernel for the process
        # id each time (CPython 3.11), a system call per request.
        self._handler = asyncio.current_task(self.loop)
        self._watched, self._on_gone = cycle, on_gone
        if cycle.disconnected:
            self.loop.call_soon(self._tell_gone)
        else:
            # What the handler's next `receive` would do: read on, so that a close is seen
            # even after a large body paused reading.
            self.flow.resume_reading()
        return partial(self._unwatch, cycle)

    def _unwatch(self, cycle: RequestResponseCycle) -> None:
        if self._watched is cycle:
            self._watched = self._handler = self._on_gone = None

    def _tell_gone(self) -> None:
        cycle, handler, on_gone = self._watched, self._handler, self._on_gone
        self._watched = self._handler = self._on_gone = None
        if on_gone is None or cycle is None or cycle.response_complete:
            return
        if on_gone() and handler is not None:
            handler.cancel()

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # the rest of a refused body: read only so the answer is not reset
        if self._in_head and len(data) <= self.limits.max_head_bytes - self._head_bytes:
            # The usual case, a request (or its start) within the head's room: as below, whole.
            self._head_bytes += len(data)
            if self._feed(data):
                self._arm_pending_timers()
            return
        view = memoryview(data)
        while view and not self.transport.is_closing():
            if self._in_head:
                room = self.limits.max_head_bytes - self._head_bytes
                if room <= 0:
                    self._refuse_head_too_large()
                    return
                piece, view = view[:room], view[room:]
                self._head_bytes += len(piece)
            else:
                if not self.cycle.response_complete:
                    self._body_raw_bytes += len(view)
                    if self._body_raw_bytes > 2 * self._body_ceiling():
                        # Chunk framing or trailers far beyond any body we accept.
                        self._refuse(413, *_too_large(self.limits.max_body_bytes))
                        return
                piece, view = view, view[:0]
            # httptools reads a memoryview in place: no copy of a large body's chunks.
            if not self._feed(piece):
                return
        self._arm_pending_timers()

    def _feed(self, data: bytes | memoryview) -> bool:
        """uvicorn's data_received, with this class's refusals answered; False once the
        connection is done for."""
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # uvicorn's own handling: this gateway serves no WebSockets, so it only warns.
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return False
        except httptools.HttpParserError as exc:
            refusal = exc.__context__
            if isinstance(refusal, _Refusal):
                self._refuse(refusal.status, refusal.message, refusal.code)
            else:
                self.logger.warning("Invalid HTTP request received: %s", exc)
                self.send_400_response("Invalid HTTP request received.")
            return False
        return True

    def _refuse_head_too_large(self) -> None:
        # A long URL has been refused by on_url already: what is left is headers.
        self._refuse(431, "The request headers are too large.", "headers_too_large")

    def send_400_response(self, msg: str) -> None:
        # uvicorn's answer to what llhttp refuses (smuggling included), in the gateway's shape.
        self._cancel_timers()
        self.transport.write(error_response(400, msg, "invalid_http"))
        self.transport.close()

    def _refuse(self, status: int, message: str, code: str) -> None:
        """Answer with an error and close, whatever state the request is in."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # The application may be running: it sees a disconnect and its writes are dropped.
            cycle.disconnected = True
            cycle.message_event.set()
            if cycle is self._watched:
                self._tell_gone()
            if cycle.response_started:
                self.transport.close()
                return
        self.logger.info("refused a request: %d %s", status, message)
        self.transport.write(error_response(status, message, code))
        # The client may still be sending: closing now could reset the connection before it
        # reads the answer.
        self._linger()

    # --- parser callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_count = 0
        self._trailer_bytes = 0
        self._body_bytes = 0
        self._body_raw_bytes = 0
        self._head_begun = True

    def on_url(self, url: bytes) -> None:
        if len(self.url) + len(url) > self.limits.max_url_bytes:
            raise _Refusal(414, "The request URL is too long.", "url_too_long")
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_head:
            # A trailer field: never merged into headers the application has already read.
            self._trailer_bytes += len(name) + len(value)
            if self._trailer_bytes > self.limits.max_head_bytes:
                raise _Refusal(431, "The request trailers are too large.", "headers_too_large")
            return
        self._header_count += 1
        if self._header_count > self.limits.max_headers:
            raise _Refusal(
                431,
                f"The request has more than {self.limits.max_headers} headers.",
                "headers_too_large",
            )
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._head_begun = False
        self._cancel_head_timer()
        self._in_head = False
        if self.parser.get_http_version() == "1.0" and self._has_transfer_encoding():
            # HTTP/1.0 has no transfer codings: RFC 9112 6.1 has such a message's framing
            # treated as faulty. llhttp read the chunked body, uvicorn served it and closed the
            # connection, and the requests pipelined behind it were lost without an answer.
            raise _Refusal(
                400,
                "Transfer-Encoding is not part of HTTP/1.0; send the body with Content-Length "
                "or use HTTP/1.1.",
                "invalid_http",
            )
        declared = self._declared_length()
        if declared is not None and declared > self.limits.max_body_bytes:
            raise _Refusal(413, *_too_large(self.limits.max_body_bytes))
        super().on_headers_complete()
        if self.cycle is not None:
            # Before the cycle's task first runs, so the application is given this class's send.
            self.cycle.__class__ = ResponseCycle
            cast(ResponseCycle, self.cycle).loop = self.loop
            if not any(c is self.cycle for c, _ in self.pipeline):
                self._body_awaited = True

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > self._body_ceiling():
            raise _Refusal(413, *_too_large(self.limits.max_body_bytes))
        if (
            self.parser.should_upgrade() and self._should_upgrade()
        ) or self.cycle.response_complete:
            return  # as uvicorn's on_body: a body after the answer is read and dropped
        # Held by the cycle (this class's, on_headers_complete) until the body is whole
        # (ResponseCycle.receive): no wake-up of the application per piece.
        if cast(ResponseCycle, self.cycle).take_body(body):
            self.flow.pause_reading()

    def on_message_complete(self) -> None:
        self._body_awaited = False
        self._cancel_body_timer()
        self._in_head = True
        self._head_bytes = 0
        super().on_message_complete()

    def answered_early(self, cycle: RequestResponseCycle) -> None:
        """`cycle` answered before its request's body was all read: its connection closes after
        the answer (gateway/response_cycle.py)."""
        self._answered_early = cycle

    def on_response_complete(self) -> None:
        if self._answered_early is None or self._answered_early is not self.cycle:
            super().on_response_complete()
            return
        # Answered before the body was read (a 401, a 413): do not read on to find the next
        # request in it.
        self._answered_early = None
        self.server_state.total_requests += 1
        self._cancel_body_timer()
        self._linger()

    # --- timers -----------------------------------------------------------------------

    def _arm_pending_timers(self) -> None:
        if self.transport.is_closing():
            return
        if self._head_begun and self._head_timer is None:
            self._arm_head_timer()
        if self._body_awaited and self._body_timer is None:
            self._body_timer = self.loop.call_later(self.limits.body_timeout_s, self._body_late)

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.limits.head_timeout_s, self._head_late)

    def _head_late(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.logger.info("closed a connection that did not send its request head in time")
            self.transport.close()

    def _body_late(self) -> None:
        self._body_timer = None
        if not self.transport.is_closing():
            self._refuse(408, "The request body did not arrive in time.", "request_timeout")

    def _linger(self) -> None:
        """Half-close after the answer, discard what the client still sends, then close."""
        if self._lingering or self.transport.is_closing():
            return
        self._lingering = True
        self._cancel_timers()
        self.flow.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._linger_timer = self.loop.call_later(self.limits.linger_s, self.transport.close)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _cancel_timers(self) -> None:
        self._cancel_head_timer()
        self._cancel_body_timer()
        if self._linger_timer is not None and self.transport.is_closing():
            self._linger_timer.cancel()
            self._linger_timer = None

    # --- helpers ----------------------------------------------------------------------

    def _body_ceiling(self) -> int:
        return self.limits.max_body_bytes + self.limits.body_backstop_slack_bytes

    def _has_transfer_encoding(self) -> bool:
        return any(name == b"transfer-encoding" for name, _ in self.headers)

    def _declared_length(self) -> int | None:
        # llhttp has already refused a malformed or repeated Content-Length.
        for name, value in self.headers:
            if name == b"content-length":
                return int(value)
        return None


def watch_client(
    receive: Callable[[], Any], on_gone: Callable[[], bool]
) -> Callable[[], None] | None:
    """From the task handling a request: have `on_gone` called once if the request's client
    leaves before its response completes, and that task cancelled if it answers True; by the
    connection itself, with no task waiting on `receive` per request (what that cost: a task
    created and cancelled, and the cancellation's traceback left to the cycle collector). The
    function returned stops watching; None when `receive` is not this module's server's, for
    the caller to watch `receive` itself."""
    cycle = getattr(receive, "__self__", None)
    if not isinstance(cycle, ResponseCycle):
        return None
    protocol = getattr(cycle.on_response, "__self__", None)
    if not isinstance(protocol, LimitedHttpToolsProtocol):
        return None
    return protocol.watch(cycle, on_gone)


def _too_large(max_bytes: int) -> tuple[str, str]:
    return f"The request body is larger than {max_bytes} bytes.", "request_too_large"


def limited_protocol(limits: HttpLimits) -> type[LimitedHttpToolsProtocol]:
    """A protocol class for uvicorn's `http=` with these limits."""
    return type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,), {"limits": limits})
