"""The load generator: N keep-alive connections, each sending the next request as soon as the
last answer ended (closed loop), for a warm-up and then a measured window.

Raw asyncio Protocols on uvloop with the request pre-built as bytes and just enough response
parsing to find where an answer ends (Content-Length, or the chunked terminator). On the 2-core
bench machine, sharing one core with the stand-in, this drives about 21,000 requests a second
at concurrency 16-64 where a tight aiohttp client loop managed 3,200-3,800, so it is kept; and
against a proxy it uses under a fifth of its core, so one process is enough (a second one
could only share the same core).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import cast

_HEAD, _BODY, _CHUNK_SIZE, _CHUNK_DATA, _TRAILER, _UNTIL_CLOSE = range(6)
DONE_MARKER = b"data: [DONE]"
ERROR_SNIPPET = 300


def build_request(
    host: str, port: int, path: str, body: dict[str, object], authorization: str | None
) -> bytes:
    payload = json.dumps(body, separators=(",", ":")).encode()
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(payload)}",
    ]
    if body.get("stream"):
        lines.append("Accept: text/event-stream")
    if authorization:
        lines.append(f"Authorization: {authorization}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


class ResponseReader:
    """Where one HTTP/1.1 response ends, fed bytes as they arrive; `reset()` between responses.

    After `feed` returns True: `status`, `keep_alive`, `saw_done` (an SSE `data: [DONE]` event
    was in a chunk) and, for a non-2xx answer, the start of its body in `error_body`.
    `body_started` turns True when the first body bytes (a whole chunk, when chunked) are in.
    """

    __slots__ = (
        "_buf",
        "_remaining",
        "_state",
        "body_started",
        "error_body",
        "keep_alive",
        "saw_done",
        "status",
    )

    def __init__(self) -> None:
        self._buf = bytearray()
        self.reset()

    def reset(self) -> None:
        self._state = _HEAD
        self._remaining = 0
        self.status = 0
        self.keep_alive = True
        self.body_started = False
        self.saw_done = False
        self.error_body = b""

    def _keep(self, piece: bytes | bytearray) -> None:
        if self.status >= 300 and len(self.error_body) < ERROR_SNIPPET:
            self.error_body += bytes(piece[: ERROR_SNIPPET - len(self.error_body)])

    def feed(self, data: bytes) -> bool:
        """True once the response is complete."""
        buf = self._buf
        buf += data
        while True:
            state = self._state
            if state == _HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    return False
                head = bytes(buf[:end]).lower()
                del buf[: end + 4]
                self.status = int(head[9:12])
                if b"\r\nconnection: close" in head:
                    self.keep_alive = False
                if b"\r\ntransfer-encoding: chunked" in head:
                    self._state = _CHUNK_SIZE
                    continue
                at = head.find(b"\r\ncontent-length:")
                if at < 0:
                    # Delimited by the connection closing: `finish_at_close` completes it.
                    self.keep_alive = False
                    self._state = _UNTIL_CLOSE
                    continue
                stop = head.find(b"\r\n", at + 2)
                self._remaining = int(head[at + 17 : stop if stop >= 0 else len(head)])
                self._state = _BODY
            elif state == _BODY:
                if self._remaining == 0:
                    return True
                if not buf:
                    return False
                self.body_started = True
                take = min(self._remaining, len(buf))
                self._keep(buf[:take])
                del buf[:take]
                self._remaining -= take
            elif state == _CHUNK_SIZE:
                end = buf.find(b"\r\n")
                if end < 0:
                    return False
                size = int(bytes(buf[:end]).partition(b";")[0], 16)
                del buf[: end + 2]
                if size == 0:
                    self._state = _TRAILER
                else:
                    self._remaining = size + 2  # the data and its CRLF
                    self._state = _CHUNK_DATA
            elif state == _CHUNK_DATA:
                if len(buf) < self._remaining:
                    return False
                chunk = buf[: self._remaining - 2]
                del buf[: self._remaining]
                self.body_started = True
                if DONE_MARKER in chunk:
                    self.saw_done = True
                self._keep(chunk)
                self._state = _CHUNK_SIZE
            elif state == _TRAILER:
                end = buf.find(b"\r\n")
                if end < 0:
                    return False
                del buf[: end + 2]
                if end == 0:
                    return True
            else:  # _UNTIL_CLOSE
                if buf:
                    self.body_started = True
                    self._keep(buf)
                    buf.clear()
                return False

    def finish_at_close(self) -> bool:
        """At connection close: True if that completes the response (read until close)."""
        return self._state == _UNTIL_CLOSE


@dataclass
class LoadResult:
    concurrency: int
    duration_s: float
    completed: int = 0
    # Every answer that succeeded, warm-up and drain included: to divide CPU time by.
    answered: int = 0
    errors: int = 0
    # Seconds from sending a request to the end of its answer / to its first body bytes, for
    # the requests that ended inside the measured window.
    latencies_s: list[float] = field(default_factory=list)
    first_byte_s: list[float] = field(default_factory=list)
    first_error: str | None = None

    @property
    def rate(self) -> float:
        return self.completed / self.duration_s if self.duration_s > 0 else 0.0


class _Run:
    def __init__(
        self,
        request: bytes,
        concurrency: int,
        warmup_s: float,
        duration_s: float,
        expect_done: bool,
        pause_s: float = 0.0,
    ) -> None:
        self.request = request
        self.expect_done = expect_done
        self.pause_s = pause_s
        self.result = LoadResult(concurrency=concurrency, duration_s=duration_s)
        now = time.perf_counter()
        self.measure_from = now + warmup_s
        self.measure_until = self.measure_from + duration_s
        self.open = 0
        self.all_closed = asyncio.Event()
        self.connections: list[_Connection] = []

    def error(self, message: str) -> None:
        if self.measure_from <= time.perf_counter() <= self.measure_until:
            self.result.errors += 1
        if self.result.first_error is None:
            self.result.first_error = message

    def closed(self) -> None:
        self.open -= 1
        if self.open == 0:
            self.all_closed.set()


class _Connection(asyncio.Protocol):
    def __init__(self, run: _Run) -> None:
        self._run = run
        self._reader = ResponseReader()
        self._transport: asyncio.Transport | None = None
        self._sent_at = 0.0
        self._first_at = 0.0
        self._busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self._transport = cast(asyncio.Transport, transport)
        self._run.open += 1
        self._run.connections.append(self)
        self._send()

    def _send(self) -> None:
        assert self._transport is not None
        self._reader.reset()
        self._busy = True
        self._first_at = 0.0
        self._sent_at = time.perf_counter()
        self._transport.write(self._run.request)

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        started = reader.body_started
        if not reader.feed(data):
            if not started and reader.body_started:
                self._first_at = time.perf_counter()
            return
        self._done(time.perf_counter())

    def _done(self, now: float) -> None:
        self._busy = False
        run = self._run
        reader = self._reader
        if self._first_at == 0.0:
            self._first_at = now
        if reader.status != 200:
            run.error(f"HTTP {reader.status}: {reader.error_body.decode(errors='replace')}")
        elif run.expect_done and not reader.saw_done:
            run.error("the stream ended without data: [DONE]")
        else:
            result = run.result
            result.answered += 1
            if run.measure_from <= now <= run.measure_until:
                result.completed += 1
                result.latencies_s.append(now - self._sent_at)
                result.first_byte_s.append(self._first_at - self._sent_at)
        assert self._transport is not None
        if now >= run.measure_until or not reader.keep_alive:
            self._transport.close()
        elif run.pause_s:
            asyncio.get_running_loop().call_later(run.pause_s, self._send_paused)
        else:
            self._send()

    def _send_paused(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._send()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        run = self._run
        if self._busy:
            if self._reader.finish_at_close():
                self._done(time.perf_counter())
            else:
                run.error(f"connection lost mid-answer: {exc!r}")
        self._transport = None
        run.closed()


async def _open(host: str, port: int, run: _Run) -> None:
    loop = asyncio.get_running_loop()
    await loop.create_connection(lambda: _Connection(run), host, port)


async def run_load(
    host: str,
    port: int,
    request: bytes,
    *,
    concurrency: int,
    duration_s: float,
    warmup_s: float,
    expect_done: bool = False,
    drain_timeout_s: float = 30.0,
    pause_s: float = 0.0,
) -> LoadResult:
    """Keep `concurrency` requests in flight for `warmup_s` + `duration_s`; count what ends in
    the window after the warm-up. A connection the server closes is opened again. `pause_s`:
    each connection waits that long after an answer before its next request (a paced load,
    below what the server can take)."""
    run = _Run(request, concurrency, warmup_s, duration_s, expect_done, pause_s)
    await asyncio.gather(*(_open(host, port, run) for _ in range(concurrency)))
    # Reopen what the server closed (Connection: close, keep-alive limits) until the window
    # ends; then wait for the last answers to come in.
    while time.perf_counter() < run.measure_until:
        missing = concurrency - run.open
        if missing > 0:
            try:
                await asyncio.gather(*(_open(host, port, run) for _ in range(missing)))
            except OSError as exc:
                run.error(f"connect failed: {exc!r}")
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.01)
    run.all_closed.clear()
    if run.open:
        try:
            async with asyncio.timeout(drain_timeout_s):
                await run.all_closed.wait()
        except TimeoutError:
            pass
    if run.open:
        run.error(f"{run.open} answers still missing {drain_timeout_s:g} s after the window")
        for connection in run.connections:
            connection.close()
    return run.result
