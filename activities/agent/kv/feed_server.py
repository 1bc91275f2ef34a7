"""The agent's KV feed over HTTP: `GET kv.feed.FEED_PATH` streams the hub's snapshot
and deltas as newline-delimited JSON (kv/feed.py), `GET STATUS_PATH` tells an operator
what each replica's subscriber has seen. Both want `Authorization: Bearer <kv_feed_token(node
secret)>`: a gateway derives it from the master secret, so only gateways read what the node's
caches hold (block ids are hashes of prompts' tokens).

The listener binds the agent's node address, where gateways reach it; the agent starts it only
when its feed port is set (port 0 is "no feed" to the agent; here it binds any free port, which
tests use).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from dataclasses import dataclass

from aiohttp import web

from activities.agent.kv.hub import FeedEnded, FeedReader, KvHub
from activities.http_site import start_site
from kv.feed import FEED_PATH, PING_EVERY_S, FeedPing, encode
from workflows.engine_keys import kv_feed_token

STATUS_PATH = "/kv/v1/status"
# Messages written at a time: a snapshot's lines go out in writes of at most ~6 MB.
WRITE_BATCH = 64
_HUB = web.AppKey("hub", KvHub)
_TOKEN = web.AppKey("token", str)


def feed_app(hub: KvHub, node_secret: bytes) -> web.Application:
    app = web.Application()
    app[_HUB] = hub
    app[_TOKEN] = kv_feed_token(node_secret)
    app.router.add_get(FEED_PATH, _feed)
    app.router.add_get(STATUS_PATH, _status)
    return app


@dataclass
class FeedServer:
    hub: KvHub
    runner: web.AppRunner
    port: int

    async def stop(self) -> None:
        # Streams never end on their own: end them first, or cleanup waits on each one.
        self.hub.end_readers()
        await self.runner.cleanup()


async def start_feed_server(hub: KvHub, node_secret: bytes, host: str, port: int) -> FeedServer:
    """Serve the feed on host:port (0: any free port); the port it got is in the result."""
    # Cancelled when its gateway disconnects: a quiet stream would otherwise notice only at its
    # next ping.
    app = feed_app(hub, node_secret)
    runner, bound = await start_site(app, host, port, handler_cancellation=True)
    return FeedServer(hub, runner, bound)


def _authorized(request: web.Request) -> bool:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    expected = request.app[_TOKEN]
    # Compared in constant time: the token is the feed's only lock.
    return scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), expected.encode())


def _unauthorized() -> web.Response:
    return web.json_response(
        {"error": "a KV feed token is required (Authorization: Bearer ...)"},
        status=401,
        headers={"WWW-Authenticate": "Bearer"},
    )


async def _status(request: web.Request) -> web.StreamResponse:
    if not _authorized(request):
        return _unauthorized()
    return web.json_response(request.app[_HUB].status())


async def _feed(request: web.Request) -> web.StreamResponse:
    if not _authorized(request):
        return _unauthorized()
    hub = request.app[_HUB]
    reader = hub.attach()
    response = web.StreamResponse(
        headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-store"}
    )
    try:
        await response.prepare(request)
        writing = asyncio.ensure_future(_write(reader, response))
        ended = asyncio.ensure_future(reader.ended.wait())
        try:
            await asyncio.wait({writing, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
            writing.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, FeedEnded):
                await writing
        if reader.ended.is_set() and request.transport is not None:
            # A write may be stuck behind a gateway that stopped reading: drop the connection
            # rather than wait on it. The gateway reconnects for a new snapshot.
            request.transport.abort()
    except ConnectionError:
        pass  # the gateway went away
    finally:
        hub.detach(reader)
    return response


async def _write(reader: FeedReader, response: web.StreamResponse) -> None:
    while True:
        messages = reader.take(WRITE_BATCH)
        if messages:
            await response.write(b"".join(encode(m) for m in messages))
        elif not await reader.wait(PING_EVERY_S):
            # Quiet: say so, with the last seq sent, so either end notices a dead connection.
            await response.write(encode(FeedPing(reader.last_seq)))
