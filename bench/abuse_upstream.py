"""The hostile-client benchmark's stand-in engine: bench-gateway's stand-in (a raw asyncio
HTTP/1.1 server, never the bottleneck), extended with what abuse needs.

- /v1/completions as well as /v1/chat/completions;
- a stream as long as the request's `max_tokens` (one SSE event a token), so a slow reader can
  be sent megabytes, more than the sockets between it and the gateway hold;
- request bodies of many megabytes, parsed incrementally: the request head is found once, and
  the body counted, where bench-gateway's stand-in searched its whole buffer on every read.

    python -m bench.abuse_upstream --port P
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import re
import sys
from collections import deque
from typing import cast

import uvloop
from typing_extensions import override

from bench.gateway.standin import (
    chunked_sse_response,
    completion_body,
    plain_response,
    sse_events,
)

_STREAM_TRUE = re.compile(rb'"stream"\s*:\s*true')
_MAX_TOKENS = re.compile(rb'"max_tokens"\s*:\s*(\d+)')
DEFAULT_TOKENS = 16
WRITE_PIECE = 256 * 1024
# The longest answer built: enough for megabytes of stream, bounded for the stand-in's memory.
MAX_TOKENS = 200_000
NOT_FOUND = plain_response(b'{"error":{"message":"not found"}}', "404 Not Found")
CHUNKED_REFUSED = plain_response(
    b'{"error":{"message":"send the body with Content-Length"}}', "400 Bad Request"
)


def _tokens(body: bytes) -> int:
    # Only the body's head: a multi-megabyte prompt is not searched for a field written first.
    match = _MAX_TOKENS.search(body, 0, 4096) or _MAX_TOKENS.search(body)
    tokens = int(match.group(1)) if match else DEFAULT_TOKENS
    return max(1, min(tokens, MAX_TOKENS))


@functools.lru_cache(maxsize=16)
def chat_answer(tokens: int, stream: bool) -> bytes:
    if stream:
        return chunked_sse_response(sse_events(tokens))
    return plain_response(completion_body(tokens))


@functools.lru_cache(maxsize=16)
def text_answer(tokens: int) -> bytes:
    body = {
        "id": "cmpl-bench",
        "object": "text_completion",
        "created": 0,
        "model": "mock",
        "choices": [{"index": 0, "text": "tok " * tokens, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": 1 + tokens},
    }
    return plain_response(json.dumps(body, separators=(",", ":")).encode())


def answer(head: bytes, body: bytes) -> bytes:
    """`head` is the request line and headers, lower-cased."""
    method, _, rest = head.partition(b" ")
    path = rest.partition(b" ")[0].partition(b"?")[0]
    if method != b"post":
        return NOT_FOUND
    if path == b"/v1/chat/completions":
        return chat_answer(_tokens(body), bool(_STREAM_TRUE.search(body)))
    if path == b"/v1/completions":
        return text_answer(_tokens(body))
    return NOT_FOUND


class RequestSplitter:
    """Whole requests out of a byte stream: the head found once, then the body counted."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._head: bytes | None = None
        self._length = 0
        self._searched = 0

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        """Every (lower-cased head, body) completed by `data`."""
        buf = self._buf
        buf += data
        done: list[tuple[bytes, bytes]] = []
        while True:
            if self._head is None:
                # Search only what is new (less 3 bytes, for a CRLFCRLF split across reads).
                end = buf.find(b"\r\n\r\n", max(0, self._searched - 3))
                if end < 0:
                    self._searched = len(buf)
                    return done
                self._head = bytes(buf[:end]).lower()
                del buf[: end + 4]
                self._searched = 0
                self._length = _content_length(self._head)
            if len(buf) < self._length:
                return done
            done.append((self._head, bytes(buf[: self._length])))
            del buf[: self._length]
            self._head = None


def _content_length(head: bytes) -> int:
    at = head.find(b"\r\ncontent-length:")
    if at < 0:
        return 0
    stop = head.find(b"\r\n", at + 2)
    return int(head[at + 17 : stop if stop >= 0 else len(head)])


class UpstreamProtocol(asyncio.Protocol):
    """Answers are written a piece at a time as the connection drains: a stream of megabytes
    to a gateway that stopped reading (its client did) waits here without being copied into
    the transport's buffer, so the stand-in's memory stays flat under slow readers."""

    def __init__(self) -> None:
        self._splitter = RequestSplitter()
        self._transport: asyncio.Transport | None = None
        self._queue: deque[tuple[memoryview, bool]] = deque()
        self._paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        for head, body in self._splitter.feed(data):
            if b"\r\ntransfer-encoding:" in head:
                self._queue.append((memoryview(CHUNKED_REFUSED), True))
                break
            close = b"\r\nconnection: close" in head
            self._queue.append((memoryview(answer(head, body)), close))
            if close:
                break
        self._pump()

    def _pump(self) -> None:
        transport = self._transport
        while transport is not None and self._queue and not self._paused:
            pending, close = self._queue[0]
            transport.write(pending[:WRITE_PIECE])
            if len(pending) > WRITE_PIECE:
                self._queue[0] = (pending[WRITE_PIECE:], close)
                continue
            self._queue.popleft()
            if close:
                transport.close()
                return

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._pump()

    @override
    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._queue.clear()


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(UpstreamProtocol, host, port, backlog=1024)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.abuse_upstream")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
