"""The proxied requests' HTTP/1.1 client for engines on plain http (the engines llmgw runs; an
external endpoint on https keeps aiohttp's client, gateway/upstream_post.py).

Why not aiohttp's ClientSession: measured side by side (bench/gateway/clients.py), it spends
about 95 us of CPU on a plain request and 120 on a stream, a fifth of the gateway's own cost per
request, where a bare keep-alive Protocol parsing answers with httptools (uvicorn's parser)
spent about 10, and this client, which is that made fit for the request path, 21 and 32. What
this keeps of aiohttp's behaviour, and the callers rely on:

- a pool of keep-alive connections per host and port, each reused for at most `keepalive_s`
  after its last answer (most recently used first), with no limit on how many;
- the connect timeout, and the read timeout while waiting for the answer's head and between two
  reads of its body;
- reading paused while more than READ_BUFFER_HIGH bytes of an answer wait unread (a slow
  streaming client holds at most that of the engine's stream here, as with aiohttp's buffer);
- aiohttp's exception types, so that callers tell failures apart as before: a connection the
  engine closed before answering is ServerDisconnectedError (or ClientOSError ECONNRESET), which
  the request goes out again for once (replica_attempts); a refused or unreachable address is
  UpstreamConnectError, never sent again; timeouts are ConnectionTimeoutError and
  SocketTimeoutError (TimeoutErrors both); an answer cut short is ClientPayloadError.

Requests carry the caller's headers, Host and Content-Length, nothing else (no Accept-Encoding:
answers are never compressed). Header names and values come from the gateway's own code, never
from a client.
"""

from __future__ import annotations

import asyncio
import errno
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import cast

import aiohttp
import httptools

# Reading from the engine pauses while this much of its answer waits to be relayed: aiohttp's
# read buffer (2**16 high water, doubled), which the stream's memory bound was measured with.
READ_BUFFER_HIGH = 128 * 1024


# Header names as engines send them -> as the answer's headers are keyed (lower case): an engine
# sends the same few names on every answer, so each is decoded and lowered once. Bounded, since
# the names come from the engine.
_HEADER_NAMES: dict[bytes, str] = {}
_HEADER_NAMES_KEPT = 64


class UpstreamConnectError(aiohttp.ClientConnectionError):
    """No connection could be made (refused, unreachable): nothing was sent."""


class UpstreamAnswer:
    """An engine's answer: `status` and `headers` (names in lower case) once it has started,
    then its body whole (`read`) or as it arrives (`content.iter_any`)."""

    def __init__(self, connection: _Connection, read_timeout_s: float) -> None:
        self._connection = connection
        self._read_timeout_s = read_timeout_s
        self.status = 0
        self.headers: dict[str, str] = {}
        self.started = False
        self.complete = False
        self._until_eof = False  # neither a length nor chunked: the body ends with the connection
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._pausable = True  # not while `read` gathers the whole body
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        # The read timeout's timer: one at a time, armed for a wait and moved on to the wait
        # then in progress when it fires, not one armed and cancelled per read (each costs
        # about 0.5 us, a stream's every token). Cancelled when the answer ends.
        self._timer: asyncio.TimerHandle | None = None
        self._wait_began = 0.0

    @property
    def content(self) -> UpstreamAnswer:
        return self  # aiohttp's response.content.iter_any(), .at_eof()

    async def read(self) -> bytes:
        self._pausable = False
        self._connection.resume()
        while not self.complete:
            await self._wait()
        body = b"".join(self._chunks)
        self._chunks.clear()
        return body

    async def iter_any(self) -> AsyncIterator[bytes]:
        """Everything buffered at each turn, as one piece."""
        while True:
            if self._chunks:
                data = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
                self._chunks.clear()
                self._buffered = 0
                self._connection.resume()
                yield data
            elif self.complete:
                return
            else:
                await self._wait()

    def at_eof(self) -> bool:
        return self.complete and not self._chunks

    def close(self) -> None:
        """Done with it: a connection whose answer is not all in is closed (the engine sees its
        client gone and stops generating); a whole answer's went back to the pool already."""
        if not self.complete:
            self._connection.close()

    release = close

    # -- what the connection calls

    async def _wait(self) -> None:
        """Until the connection has more for this answer, or the read timeout passes."""
        if self._error is not None:
            raise self._error
        loop = self._connection.loop
        waiter = self._waiter = loop.create_future()
        began = self._wait_began = loop.time()
        if self._timer is None:
            self._timer = loop.call_at(began + self._read_timeout_s, self._late, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
        if self._error is not None:
            raise self._error

    def _late(self, waiter: asyncio.Future[None]) -> None:
        """The read timeout of `waiter`'s wait has passed."""
        self._timer = None
        if not waiter.done():
            self._fail(aiohttp.SocketTimeoutError("Timeout on reading data from the engine"))
            self._connection.close()
            return
        current = self._waiter
        if current is not None and not current.done():
            # A later wait is in progress: its own read timeout runs from when it began.
            self._timer = current.get_loop().call_at(
                self._wait_began + self._read_timeout_s, self._late, current
            )

    def _disarm(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if self._error is None and not self.complete:
            self._error = error
        self._disarm()
        self._wake()

    def _head(self, status: int, chunked: bool) -> None:
        self.status = status
        self.started = True
        self._until_eof = not chunked and "content-length" not in self.headers
        self._wake()

    def _read_done(self) -> None:
        """The connection has parsed one read's bytes: wake the reader once for whatever body
        pieces they held (a stream's read often holds many events), pausing the connection when
        more than READ_BUFFER_HIGH is buffered and more is to come (a complete answer's
        connection may be back in the pool, serving another)."""
        if self._buffered > READ_BUFFER_HIGH and self._pausable and not self.complete:
            self._connection.pause()
        self._wake()

    def _end(self) -> None:
        self.complete = True
        self._disarm()
        self._wake()

    def _lost(self, exc: Exception | None) -> None:
        if self.complete:
            return
        if self.started and self._until_eof and exc is None:
            self._end()
        elif self.started:
            self._fail(aiohttp.ClientPayloadError("Response payload is not completed"))
        elif isinstance(exc, OSError) and exc.errno is not None:
            self._fail(aiohttp.ClientOSError(exc.errno, str(exc)))
        else:
            self._fail(aiohttp.ServerDisconnectedError())


class _Connection(asyncio.Protocol):
    def __init__(self, pool: UpstreamPool, key: tuple[str, int]) -> None:
        self._pool = pool
        self.key = key
        # Its loop, kept: asyncio.get_running_loop() asks the kernel for the process id each
        # time (CPython 3.11), a system call, and a request asked three times.
        self.loop = asyncio.get_running_loop()
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self.answer: UpstreamAnswer | None = None
        self.closed = False
        self.idle_since = 0.0
        self._paused = False

    def send(self, head: bytes, body: bytes, read_timeout_s: float) -> UpstreamAnswer:
        assert self._transport is not None
        assert self.answer is None
        answer = self.answer = UpstreamAnswer(self, read_timeout_s)
        self._transport.writelines((head, body))
        return answer

    def pause(self) -> None:
        if not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self._transport is not None and not self.closed:
            self._paused = False
            self._transport.resume_reading()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self._transport is not None:
                self._transport.close()

    # -- asyncio's calls

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if self.answer is None:  # nothing asked: an engine talking out of turn
            self.close()
            return
        answer = self.answer
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            answer._fail(aiohttp.ClientPayloadError(f"malformed answer: {exc}"))
            self.close()
            return
        answer._read_done()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.answer is not None:
            self.answer._lost(exc)

    # -- httptools' calls

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.answer is not None
        key = _HEADER_NAMES.get(name)
        if key is None:
            key = name.decode("latin-1").lower()
            if len(_HEADER_NAMES) < _HEADER_NAMES_KEPT:
                _HEADER_NAMES[name] = key
        self.answer.headers[key] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        assert self.answer is not None
        chunked = "chunked" in self.answer.headers.get("transfer-encoding", "").lower()
        self.answer._head(self._parser.get_status_code(), chunked)

    def on_body(self, body: bytes) -> None:
        # Called per piece of the body the parser finds (each chunk of a chunked stream, often
        # many in one read): kept, and the reader woken once per read by data_received.
        answer = self.answer
        assert answer is not None
        answer._chunks.append(body)
        answer._buffered += len(body)

    def on_message_complete(self) -> None:
        answer = self.answer
        assert answer is not None
        keep_alive = self._parser.should_keep_alive()
        self.answer = None
        answer._end()
        if keep_alive and not self.closed:
            self._pool.put(self)
        else:
            self.close()


class UpstreamPool:
    def __init__(self, connect_timeout_s: float, read_timeout_s: float, keepalive_s: float) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.keepalive_s = keepalive_s
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._closed = False

    async def post(
        self,
        host: str,
        port: int,
        host_header: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes,
        connect_timeout_s: float | None = None,
    ) -> UpstreamAnswer:
        """POST `body` to `path` at `host`:`port` and return once the answer's head is in.
        `host_header`: the Host the engine is told (with the port; an IPv6 address bracketed)."""
        key = (host, port)
        connection = self._take(key) or await self._connect(
            key, self.connect_timeout_s if connect_timeout_s is None else connect_timeout_s
        )
        # Built up as one string (a request has three or four headers): no list of lines to join.
        text = f"POST {path} HTTP/1.1\r\nHost: {host_header}\r\nContent-Length: {len(body)}\r\n"
        for name, value in headers.items():
            text += f"{name}: {value}\r\n"
        head = (text + "\r\n").encode("latin-1")
        answer = connection.send(head, body, self.read_timeout_s)
        try:
            while not answer.started:
                await answer._wait()
        except BaseException:
            connection.close()  # what it was doing is unknown: never reused
            raise
        return answer

    def put(self, connection: _Connection) -> None:
        if self._closed:
            connection.close()
            return
        connection.idle_since = connection.loop.time()
        self._idle.setdefault(connection.key, []).append(connection)

    async def close(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()

    def _take(self, key: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        # The oldest first: past the keep-alive they are closed, not reused.
        oldest_kept = idle[0].loop.time() - self.keepalive_s
        while idle and (idle[0].closed or idle[0].idle_since < oldest_kept):
            idle.pop(0).close()
        while idle:
            connection = idle.pop()
            if not connection.closed:
                return connection
        return None

    async def _connect(self, key: tuple[str, int], timeout_s: float) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                _, protocol = await loop.create_connection(
                    lambda: _Connection(self, key), key[0], key[1]
                )
        except TimeoutError as exc:
            raise aiohttp.ConnectionTimeoutError(
                f"Connection timeout to {key[0]}:{key[1]}"
            ) from exc
        except OSError as exc:
            raise UpstreamConnectError(
                exc.errno or errno.ECONNREFUSED, f"Cannot connect to {key[0]}:{key[1]}: {exc}"
            ) from exc
        return protocol
