"""The floor of one Python hop: a bare aiohttp reverse proxy, nothing else.

One aiohttp.web server and one shared ClientSession on uvloop (the loop uvicorn picks for the
gateway): forward the body, relay the JSON answer, stream SSE through chunk by chunk. No auth,
no routing, no accounting: what is left is the cost of parsing, forwarding and relaying.

    python -m bench.gateway.hop --port P --upstream http://127.0.0.1:U
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import aiohttp
import uvloop
from aiohttp import web

SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", str)


async def forward(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    url = request.app[UPSTREAM] + request.path_qs
    headers = {"Content-Type": "application/json", "Authorization": "Bearer hop"}
    async with request.app[SESSION].post(url, data=body, headers=headers) as upstream:
        if upstream.content_type != "text/event-stream":
            raw = await upstream.read()
            return web.Response(body=raw, status=upstream.status, content_type="application/json")
        response = web.StreamResponse(
            status=upstream.status,
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
        )
        await response.prepare(request)
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response


async def serve(host: str, port: int, upstream: str) -> None:
    app = web.Application()
    app[UPSTREAM] = upstream.rstrip("/")
    app[SESSION] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), trust_env=False)
    app.router.add_post("/{tail:.*}", forward)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, backlog=1024).start()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
        await app[SESSION].close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway.hop")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="base URL, e.g. http://127.0.0.1:9000")
    args = parser.parse_args(argv)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(args.host, args.port, args.upstream))
    return 0


if __name__ == "__main__":
    sys.exit(main())
