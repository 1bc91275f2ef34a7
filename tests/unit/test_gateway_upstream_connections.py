"""The gateway's pooled connections to engines, against an engine whose keep-alive is scripted.

Engines close a keep-alive connection once it has been idle for 5 s (llama-server, uvicorn). A
request written onto a pooled connection at that instant finds it closed without an answer; with
one replica that was a 502 for a request nothing was wrong with. The engine here closes the
connection on any request that arrives on a connection it has already answered on, which is that
race made certain."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from store import Store
from tests.gateway_kit import (
    MODEL,
    FakeRouteSource,
    Gateway,
    assert_openai_error,
    fast_settings,
    route,
    running_gateway,
)
from tests.unit.test_gateway_proxy import metric

ANSWER = json.dumps(
    {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
    }
).encode()
# The gateway reads each engine's /metrics every second; these tests count POSTs only, and
# keep the scrape out of the pool they watch.
QUIET = {"engine_scrape_interval_s": 60}


@dataclass
class KeepAliveEngine:
    """An HTTP/1.1 engine answering chat with keep-alive. `close_reused`: a POST on a connection
    it has answered on before is met by closing it, unanswered. `close_all`: every POST is."""

    close_reused: bool = False
    close_all: bool = False
    url: str = ""
    connections: int = 0
    answered: int = 0
    closed_unanswered: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        answered_here = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.decode("latin-1").split("\r\n")[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                await reader.readexactly(length)
                is_post = head.startswith(b"POST ")
                if is_post and (self.close_all or (self.close_reused and answered_here)):
                    self.closed_unanswered += 1
                    return
                body = ANSWER if is_post else b""
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
                answered_here += 1
                self.answered += is_post
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()


@asynccontextmanager
async def keep_alive_engine(
    close_reused: bool = False, close_all: bool = False
) -> AsyncIterator[KeepAliveEngine]:
    engine = KeepAliveEngine(close_reused=close_reused, close_all=close_all)
    server = await asyncio.start_server(engine.serve, "127.0.0.1", 0)
    engine.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server:
        yield engine


@asynccontextmanager
async def gateway_to(
    store: Store, engine: KeepAliveEngine, **settings: float
) -> AsyncIterator[Gateway]:
    """A gateway whose one replica is `engine`, its scrape kept out of the pool (QUIET)."""
    source = FakeRouteSource(route("smol-0", engine.url))
    async with running_gateway(store, source, fast_settings(**QUIET, **settings)) as gw:
        yield gw


async def test_a_pooled_connection_the_engine_closed_is_sent_again_not_failed(
    store: Store,
) -> None:
    async with keep_alive_engine(close_reused=True) as engine, gateway_to(store, engine) as gw:
        for _ in range(3):
            response = await gw.chat()
            assert response.status_code == 200, response.text
        assert engine.closed_unanswered >= 1, "the gateway reused a pooled connection"
        assert engine.answered == 3
        disconnected = await metric(
            gw, "llmgw_upstream_errors_total", model=MODEL, reason="disconnected"
        )
        assert disconnected == engine.closed_unanswered
        assert await metric(gw, "llmgw_upstream_errors_total", reason="unreachable") == 0


async def test_an_engine_that_drops_every_request_is_sent_it_twice_then_502(
    store: Store,
) -> None:
    async with keep_alive_engine(close_all=True) as engine, gateway_to(store, engine) as gw:
        assert_openai_error(await gw.chat(), 502, "upstream_unreachable")
        assert engine.closed_unanswered == 2
        assert await metric(gw, "llmgw_upstream_errors_total", reason="unreachable") == 1


async def test_an_idle_connection_is_not_reused_past_the_keepalive(store: Store) -> None:
    """Past `upstream_keepalive_s` idle, the next request opens a new connection; within it, the
    pooled one is reused."""
    for keepalive_s, connections in ((0.2, 2), (30.0, 1)):
        async with keep_alive_engine() as engine:
            async with gateway_to(store, engine, upstream_keepalive_s=keepalive_s) as gw:
                assert (await gw.chat()).status_code == 200
                await asyncio.sleep(0.5)
                assert (await gw.chat()).status_code == 200
            assert engine.connections == connections, f"keep-alive {keepalive_s} s"
