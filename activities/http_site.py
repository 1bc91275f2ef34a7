"""An aiohttp app served on host:port, for the small HTTP servers llmgw runs beside its
workers: the agent's KV feed (activities/agent/kv/feed_server.py) and the control plane's
mirror (activities/control/mirror_server.py)."""

from __future__ import annotations

from typing import Any

from aiohttp import web


async def start_site(
    app: web.Application, host: str, port: int, **runner_options: Any
) -> tuple[web.AppRunner, int]:
    """The running app's runner and the port it got (port 0: any free one). Nothing is left
    running when the port cannot be bound."""
    runner = web.AppRunner(app, access_log=None, **runner_options)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound: int = runner.addresses[0][1]  # (host, port), or a 4-tuple for IPv6
    return runner, bound
