"""The gateway's request cycle: uvicorn's, with a `send` and a `receive` of its own that
gateway/http_limits.py's protocol relies on (it gives each request's cycle this class)."""

from __future__ import annotations

import asyncio

from uvicorn._types import (
    ASGIReceiveEvent,
    ASGISendEvent,
    HTTPResponseBodyEvent,
    HTTPResponseStartEvent,
)
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

# uvicorn's rules for a header's name (an RFC 9110 token) and value (no control character but
# tab), HEADER_RE and HEADER_VALUE_RE, each searched once over all of a response's names (or
# values) joined by a byte the rule allows, rather than once per header.
_NAME_JOIN = b"!"
_VALUE_JOIN = b"\t"


class ResponseCycle(RequestResponseCycle):
    """uvicorn's request cycle, its `send` written for the gateway, with two differences:
    - An answer started before the request's body was all read (a 401, a 413) says
      `connection: close` and leaves the closing to the protocol's `on_response_complete`
      (uvicorn would close at once, which can reset the connection before the client reads the
      answer).
    - An answer goes out with its head and the body's first bytes in one write: uvicorn
      writes them apart, two system calls and two TCP segments where one does. A stream's head
      waits for nothing: its first event goes with it if the application sends that before the
      loop's next turn (the relay does when the engine's first read holds it), else the head
      goes then, alone.
    Otherwise as uvicorn's `send` (0.54): the same head, the same checks of headers (the first
    error found may be another header's) and of the body's length. Its own rather than
    uvicorn's wrapped: wrapping took two calls of uvicorn's `send` and a stand-in transport per
    answer, and checked each header's name and value with a regular expression apiece. A class
    rather than a wrapper of `send` per request: that wrapper and the cycle held each other,
    garbage only the cycle collector could free.

    And its `receive` hands the request's body over whole, where uvicorn's wakes the
    application for each piece the socket gave (a 200 KB body came in four or more, each
    joined into a bytearray, copied out to the application, and joined again there) and
    paused reading past 64 KB until the application asked for more. Here the pieces are kept
    as they came and joined once; reading pauses past that mark only while no `receive` waits
    (the body is bounded by the protocol's limit, as the application's read of it was)."""

    _held_head = b""
    # The connection's loop, set by the protocol (gateway/http_limits.py) as it gives a cycle
    # this class: asyncio's lookup of the running loop asks the kernel for the process id each
    # time (CPython 3.11).
    loop: asyncio.AbstractEventLoop
    # The request body's pieces not yet received, their size, and whether `receive` waits.
    _pieces: list[bytes] | None = None
    _piece_bytes = 0
    _receiving = False

    @property
    def held_body_bytes(self) -> int:
        """The request body's bytes read off the socket and not yet received."""
        return self._piece_bytes

    def take_body(self, piece: bytes) -> bool:
        """Keep a piece of the request's body; True where reading should pause: more than
        uvicorn's high-water mark held, and no `receive` waiting for it."""
        if self._pieces is None:
            self._pieces = [piece]
        else:
            self._pieces.append(piece)
        self._piece_bytes += len(piece)
        return self._piece_bytes > HIGH_WATER_LIMIT and not self._receiving

    async def receive(self) -> ASGIReceiveEvent:
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.waiting_for_100_continue = False
        if not self.disconnected and not self.response_complete:
            # Woken when the body is whole (the protocol's on_message_complete), the client
            # gone, or the answer sent.
            self.flow.resume_reading()
            self._receiving = True
            try:
                await self.message_event.wait()
            finally:
                self._receiving = False
            self.message_event.clear()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        pieces, self._pieces, self._piece_bytes = self._pieces, None, 0
        if pieces is None:
            body = b""
        elif len(pieces) == 1:
            body = pieces[0]  # most bodies: one piece, no copy
        else:
            body = b"".join(pieces)
        return {"type": "http.request", "body": body, "more_body": self.more_body}

    async def send(self, message: ASGISendEvent) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(
                    f"Expected ASGI message 'http.response.start', but got '{kind}'."
                )
            self._start(message)  # type: ignore[arg-type]
        elif not self.response_complete:
            if kind != "http.response.body":
                raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{kind}'.")
            self._body(message)  # type: ignore[arg-type]
        else:
            raise RuntimeError(
                f"Unexpected ASGI message '{kind}' sent, after response already completed."
            )

    def _start(self, message: HTTPResponseStartEvent) -> None:
        self.response_started = True
        self.waiting_for_100_continue = False
        status = message["status"]
        headers = [*self.default_headers, *message.get("headers", ())]
        early = self.more_body  # the body is not all read
        if self.access_log:
            self.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                get_client_addr(self.scope),
                self.scope["method"],
                get_path_with_query_string(self.scope),
                self.scope["http_version"],
                status,
            )
        if HEADER_RE.search(_NAME_JOIN.join([name for name, _ in headers])):
            raise RuntimeError("Invalid HTTP header name.")
        if HEADER_VALUE_RE.search(_VALUE_JOIN.join([value for _, value in headers])):
            raise RuntimeError("Invalid HTTP header value.")
        content = [STATUS_LINE[status]]
        closing = False  # the answer's own headers say connection: close
        for name, value in headers:
            name = name.lower()
            if name == b"content-length" and self.chunked_encoding is None:
                self.expected_content_length = int(value.decode())
                self.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif name == b"connection" and b"close" in [
                token.lower().strip() for token in value.split(b",")
            ]:
                self.keep_alive = False
                closing = True
            content += (name, b": ", value, b"\r\n")
        if early:
            content.append(b"connection: close\r\n")
            # The protocol (gateway/http_limits.py) closes the connection after the answer:
            # the cycle does not close it first.
            self.keep_alive = True
        elif not self.keep_alive and not closing:
            content.append(b"connection: close\r\n")
        if (
            self.chunked_encoding is None
            and self.scope["method"] != "HEAD"
            and status not in (204, 304)
        ):
            self.chunked_encoding = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        head = b"".join(content)
        if not early:
            self._held_head = head  # for the body's first write
            if self.chunked_encoding is not False:
                # A stream's: sent by the body's first write if that comes before the loop's
                # next turn (an event the engine had sent already), else then, on its own.
                self.loop.call_soon(self._send_held_head)
            return
        self.transport.write(head)
        answered_early = getattr(
            getattr(self.on_response, "__self__", None), "answered_early", None
        )
        if answered_early is not None:
            answered_early(self)

    def _send_held_head(self) -> None:
        head, self._held_head = self._held_head, b""
        if head and not self.disconnected and not self.transport.is_closing():
            self.transport.write(head)

    def _body(self, message: HTTPResponseBodyEvent) -> None:
        body = message.get("body", b"")
        more_body = message.get("more_body", False)
        head, self._held_head = self._held_head, b""
        if self.scope["method"] == "HEAD":
            self.expected_content_length = 0
            out = b""
        elif self.chunked_encoding:
            out = b"%x\r\n%b\r\n" % (len(body), body) if body else b""
            if not more_body:
                out += b"0\r\n\r\n"
        else:
            if len(body) > self.expected_content_length:
                raise RuntimeError("Response content longer than Content-Length")
            self.expected_content_length -= len(body)
            out = body
        if head or out:
            self.transport.write(head + out if head else out)
        if not more_body:
            if self.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.message_event.set()
            if not self.keep_alive:
                self.transport.close()
            self.on_response()
