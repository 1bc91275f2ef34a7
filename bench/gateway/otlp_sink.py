"""Where the traced gateway arm sends its spans: an OTLP/HTTP receiver that takes each batch
and answers 200, as a collector would, so the arm pays for making, batching and posting spans
and nothing on this side holds it back. It counts what it took, printed at exit.

    python -m bench.gateway.otlp_sink --port P
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

import uvloop
from aiohttp import web

POSTS = web.AppKey("posts", list)


async def traces(request: web.Request) -> web.Response:
    request.app[POSTS].append(len(await request.read()))
    # An empty ExportTraceServiceResponse: every span accepted.
    return web.Response(body=b"", content_type="application/x-protobuf")


async def serve(host: str, port: int) -> None:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[POSTS] = []
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        await stop.wait()
    finally:
        posts = app[POSTS]
        print(f"otlp sink: {len(posts)} batches, {sum(posts):,} bytes", file=sys.stderr)
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway.otlp_sink")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
