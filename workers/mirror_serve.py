"""`llmgw mirror serve`: the control plane's mirror over HTTP, for the node agents' fetches
(activities/control/mirror_server.py). A process of its own, beside the mirror's files
(<state>/mirror): it reads the master secret from the gateway's store once at start, to check
each node's token, and nothing else of the store."""

import asyncio
import logging

from activities.control.mirror_server import start_mirror_server
from store import open_store
from workers.paths import Locations
from workers.signals import stop_event

log = logging.getLogger("llmgw.mirror")


async def serve_mirror(where: Locations, host: str, port: int) -> None:
    store = open_store(where.database_url, where.state_dir)
    await store.init()
    try:
        master = await store.master_secret()
    finally:
        await store.close()
    root = where.mirror_dir
    root.mkdir(parents=True, exist_ok=True)
    stop = stop_event()
    server = await start_mirror_server(root, master, host, port)
    log.info("mirror of %s on %s:%d", root, host, server.port)
    try:
        await stop.wait()
    finally:
        await server.stop()


def main(where: Locations, host: str, port: int) -> None:
    asyncio.run(serve_mirror(where, host, port))
