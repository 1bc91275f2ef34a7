"""The gateway's request cycle: uvicorn's, with the changes to its `send` that
gateway/http_limits.py's protocol relies on (it gives each request's cycle this class)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from uvicorn._types import ASGISendEvent, HTTPResponseStartEvent
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle


class ResponseCycle(RequestResponseCycle):
    """uvicorn's request cycle, with two changes to its `send`:
    - An answer started before the request's body was all read (a 401, a 413) says
      `connection: close` and leaves the closing to the protocol's `on_response_complete`
      (uvicorn would close at once, which can reset the connection before the client reads the
      answer).
    - An answer with a Content-Length (every answer but a stream) goes out with its head and
      the body's first bytes in one write: uvicorn writes them apart, two system calls and two
      TCP segments where one does.
    A class rather than a wrapper of `send` per request: that wrapper and the cycle held each
    other, garbage only the cycle collector could free."""

    _held_head = b""

    async def send(self, message: ASGISendEvent) -> None:
        if message["type"] == "http.response.start":
            if self.more_body:
                await self._send_early(message)
            else:
                await self._send_head(message)
            return
        head = self._held_head
        if not head:
            await super().send(message)
            return
        self._held_head = b""
        transport = self.transport
        first = _HeadFirst(transport, head)
        self.transport = cast(asyncio.Transport, first)
        try:
            await super().send(message)
        finally:
            self.transport = transport
        first.flush()  # no body was written (a HEAD request): the head alone

    async def _send_head(self, message: HTTPResponseStartEvent) -> None:
        transport = self.transport
        held = _HeadHeld(transport)
        self.transport = cast(asyncio.Transport, held)
        try:
            await super().send(message)
        finally:
            self.transport = transport
        if self.chunked_encoding is False:
            self._held_head = held.head  # for the body's first write
        elif held.head:
            transport.write(held.head)  # a stream: its head at once

    async def _send_early(self, message: HTTPResponseStartEvent) -> None:
        headers = [*message.get("headers", ()), (b"connection", b"close")]
        await super().send({**message, "headers": headers})
        self.keep_alive = True  # uvicorn's flag, set by the header: closing is ours
        # The protocol (gateway/http_limits.py) closes the connection after the answer.
        answered_early = getattr(
            getattr(self.on_response, "__self__", None), "answered_early", None
        )
        if answered_early is not None:
            answered_early(self)


class _HeadHeld:
    """The transport as uvicorn's `send` sees it while writing a response's head: kept."""

    __slots__ = ("head", "transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.head = b""

    def write(self, data: bytes) -> None:
        self.head += data

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


class _HeadFirst(_HeadHeld):
    """The transport while uvicorn writes the body: the kept head goes first, in the same
    write, and before any close."""

    def __init__(self, transport: asyncio.Transport, head: bytes) -> None:
        super().__init__(transport)
        self.head = head

    def write(self, data: bytes) -> None:
        head, self.head = self.head, b""
        self.transport.write(head + data if head else data)

    def flush(self) -> None:
        if self.head:
            self.write(b"")

    def close(self) -> None:
        self.flush()
        self.transport.close()
