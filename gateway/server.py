"""Running the gateway in the current event loop, for `llmgw gateway` and `llmgw up`."""

from __future__ import annotations

import uvicorn

from gateway.app import create_app
from gateway.http_limits import HttpLimits, limited_protocol
from gateway.route_source import RouteSource
from gateway.settings import GatewaySettings
from gateway.store import Store

# Between two requests on one connection. uvicorn's default, stated: the head timeout
# (gateway/http_limits.py) takes over from the first byte of the next request.
KEEP_ALIVE_S = 5


def http_limits(settings: GatewaySettings) -> HttpLimits:
    return HttpLimits(max_body_bytes=settings.max_body_bytes)


def uvicorn_config(
    settings: GatewaySettings, store: Store, route_source: RouteSource
) -> uvicorn.Config:
    return uvicorn.Config(
        create_app(settings, store, route_source),
        host=settings.host,
        port=settings.port,
        # httptools (llhttp) under the bounds uvicorn leaves out; measured faster than h11, and
        # strict where smuggling is concerned.
        http=limited_protocol(http_limits(settings)),
        # Used when uvicorn makes the loop (Server.run, Config.get_loop_factory); `serve` below
        # runs in the caller's loop, which the caller chooses.
        loop="uvloop",
        timeout_keep_alive=KEEP_ALIVE_S,
        log_level="warning",
        access_log=False,
        # The admin API trusts the socket's peer address: never let a header rewrite it.
        proxy_headers=False,
        server_header=False,
        lifespan="on",
        ws="none",
    )


async def serve(settings: GatewaySettings, store: Store, route_source: RouteSource) -> None:
    """Serve until the process is told to stop (SIGINT/SIGTERM, handled by uvicorn). The store
    stays the caller's to close."""
    server = uvicorn.Server(uvicorn_config(settings, store, route_source))
    try:
        await server.serve()
    except SystemExit as exc:
        # uvicorn exits the process when start-up fails (store unreachable, port taken); in
        # `llmgw up` other components share this loop, so fail as an ordinary error instead.
        raise RuntimeError("the gateway failed to start (the reason is logged above)") from exc
