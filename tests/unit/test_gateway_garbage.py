"""A request through the gateway leaves nothing for Python's cycle collector.

Objects that hold each other (a task and its cancelled traceback, a wrapper and what it wraps)
outlive their request until the collector finds them, and the collector's passes cost the
event loop every request's time: measured at 13% of the gateway's CPU under load when each
request left about 34 such objects (docs/benchmarks.md, Gateway). Counted here as what
`gc.collect()` finds after requests through the real gateway on uvicorn, less what the same
requests sent straight to the engine leave (the test's own client and engine are in this
process too).
"""

from __future__ import annotations

import asyncio
import gc
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from store import Store
from tests.gateway_kit import (
    MODEL,
    FakeRouteSource,
    http_request,
    route,
    running_gateway,
    serving,
)

# Enough that a few objects a run touches once (an earlier test's leftovers included) are far
# below one per ten requests.
REQUESTS = 200
CHUNK = 'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
USAGE = '{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}'


@asynccontextmanager
async def engine() -> AsyncIterator[str]:
    """Answers a plain completion, or a stream of a few chunks, a usage chunk and [DONE]; and
    an empty metrics page."""

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.json_response(
                {
                    "object": "chat.completion",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
                    "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
                }
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write((CHUNK * 4).encode())
        await response.write(f'data: {{"choices":[],"usage":{USAGE}}}\n\n'.encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    async def metrics(_request: web.Request) -> web.Response:
        # Scraped by the gateway now and then: a 404 would leave aiohttp's own cycles.
        return web.Response(text="")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/metrics", metrics)
    async with serving(app) as url:
        yield url


class KeepAliveClient:
    """Requests one after another on one connection, read by their framing: a client that
    leaves no cycles of its own (httpx's requests each leave dozens, which would drown the
    gateway's)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def send(self, request: bytes) -> bytes:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), head
        length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        if length is not None:
            return await self.reader.readexactly(int(length.group(1)))
        return await self.reader.readuntil(b"\r\n0\r\n\r\n")  # chunked: to the last chunk


@asynccontextmanager
async def keep_alive(url: str) -> AsyncIterator[KeepAliveClient]:
    host, _, port = url.removeprefix("http://").rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        yield KeepAliveClient(reader, writer)
    finally:
        writer.close()


async def left_for_the_collector(url: str, authorization: str) -> int:
    """Objects in reference cycles that REQUESTS requests, half of them streamed, left."""
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "tell me about otters"}]}
    requests = [
        http_request(
            "POST",
            "/v1/chat/completions",
            headers={"Authorization": authorization, "Content-Type": "application/json"},
            body=json.dumps({**chat, "stream": stream}).encode(),
        )
        for stream in (False, True)
    ]
    async with keep_alive(url) as client:
        for request in requests:  # warm: first-use caches are not per-request garbage
            assert b"hi" in await client.send(request)
        await asyncio.sleep(0.1)  # what was ending as this began (earlier tests' too) ends
        gc.collect()
        gc.disable()
        try:
            for i in range(REQUESTS):
                assert b"hi" in await client.send(requests[i % 2])
            return gc.collect()
        finally:
            gc.enable()


async def test_requests_through_the_gateway_leave_no_cycles_behind(store: Store) -> None:
    async with engine() as url, running_gateway(store, FakeRouteSource(route("m-0", url))) as gw:
        direct = await left_for_the_collector(url, "Bearer none")
        through = await left_for_the_collector(gw.url, gw.auth["Authorization"])
    # Before: about 34 a request (a task and its cancelled traceback to watch the client, the
    # cycle's send wrapper); a few in all are allowed for what a run touches once.
    assert through - direct < REQUESTS // 10, (through, direct)
