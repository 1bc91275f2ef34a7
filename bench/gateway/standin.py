"""The stand-in upstream: an OpenAI-compatible endpoint that is never the bottleneck.

A raw asyncio Protocol speaking just enough HTTP/1.1 (keep-alive, Content-Length request
bodies): POST /v1/chat/completions answers one pre-built JSON completion with usage, or, when
the body asks for `"stream": true`, one pre-built SSE stream (N content chunks, a finish chunk,
a usage chunk and `data: [DONE]`) in chunked transfer encoding, written in one go. Any bearer
is accepted, so the gateway's derived engine key and LiteLLM's dummy key both pass. GET /health
answers 200 with an empty body, as vLLM's own server does: the vLLM router waits for it before it
serves, and asks again now and then.

    python -m bench.gateway.standin --port P [--chunks 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from typing import cast

import uvloop
from typing_extensions import override

MODEL = "mock"
DEFAULT_CHUNKS = 16
COMPLETION_PATH = b"/v1/chat/completions"
HEALTH_PATH = b"/health"
PROMPT_TOKENS = 9

_STREAM_TRUE = re.compile(rb'"stream"\s*:\s*true')


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def completion_body(chunks: int = DEFAULT_CHUNKS) -> bytes:
    return _json(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 0,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "tok " * chunks},
                    "finish_reason": "length",
                }
            ],
            "usage": {
                "prompt_tokens": PROMPT_TOKENS,
                "completion_tokens": chunks,
                "total_tokens": PROMPT_TOKENS + chunks,
            },
        }
    )


def sse_events(chunks: int = DEFAULT_CHUNKS) -> list[bytes]:
    """Each SSE event of one stream, `data: ...\\n\\n`, in order."""

    def chunk(delta: dict[str, str], finish: str | None) -> dict[str, object]:
        return {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    payloads = [chunk({"role": "assistant", "content": "tok "}, None)]
    payloads += [chunk({"content": "tok "}, None) for _ in range(chunks - 1)]
    payloads.append(chunk({}, "length"))
    usage = {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": chunks,
        "total_tokens": PROMPT_TOKENS + chunks,
    }
    payloads.append({**chunk({}, None), "choices": [], "usage": usage})
    return [b"data: " + _json(p) + b"\n\n" for p in payloads] + [b"data: [DONE]\n\n"]


def plain_response(body: bytes, status: str = "200 OK") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def chunked_sse_response(events: list[bytes]) -> bytes:
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    return head + b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"


class Answers:
    """Every response the stand-in sends, built once."""

    def __init__(self, chunks: int = DEFAULT_CHUNKS) -> None:
        self.plain = plain_response(completion_body(chunks))
        self.stream = chunked_sse_response(sse_events(chunks))
        self.health = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
        self.not_found = plain_response(b'{"error":{"message":"not found"}}', "404 Not Found")
        self.bad_request = plain_response(
            b'{"error":{"message":"send the body with Content-Length"}}', "400 Bad Request"
        )

    def for_request(self, head: bytes, body: bytes) -> bytes:
        """`head` is the request line and headers, lower-cased."""
        method, _, rest = head.partition(b" ")
        path = rest.partition(b" ")[0].partition(b"?")[0]
        if method == b"get" and path == HEALTH_PATH:
            return self.health
        if method != b"post" or path != COMPLETION_PATH:
            return self.not_found
        return self.stream if _STREAM_TRUE.search(body) else self.plain


def split_request(buf: bytearray) -> tuple[bytes, bytes, int] | None:
    """(lower-cased head, body, bytes consumed) of the first complete request in `buf`, or None
    while it is incomplete. A chunked request body is not supported: it reads as empty, and the
    head says so (`transfer-encoding: chunked`)."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = bytes(buf[:end]).lower()
    length = 0
    at = head.find(b"\r\ncontent-length:")
    if at >= 0:
        stop = head.find(b"\r\n", at + 2)
        length = int(head[at + 17 : stop if stop >= 0 else len(head)])
    total = end + 4 + length
    if len(buf) < total:
        return None
    return head, bytes(buf[end + 4 : total]), total


class StandinProtocol(asyncio.Protocol):
    def __init__(self, answers: Answers) -> None:
        self._answers = answers
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        transport = self._transport
        assert transport is not None
        while True:
            request = split_request(buf)
            if request is None:
                return
            head, body, used = request
            del buf[:used]
            if b"\r\ntransfer-encoding:" in head:
                transport.write(self._answers.bad_request)
                transport.close()
                return
            transport.write(self._answers.for_request(head, body))
            if b"\r\nconnection: close" in head:
                transport.close()
                return

    @override
    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None


async def serve(host: str, port: int, chunks: int) -> None:
    answers = Answers(chunks)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: StandinProtocol(answers), host, port, backlog=1024)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway.standin")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=DEFAULT_CHUNKS)
    args = parser.parse_args(argv)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(args.host, args.port, args.chunks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
