"""`llmgw gateway`: the OpenAI front door, reading routes from the store in the background.

With `--workers N` it runs N gateway processes sharing the public port (SO_REUSEPORT: the kernel
spreads connections among them), so the gateway uses N cores. Each worker is a whole gateway:
its own routing table and KV index fed from the same sources (the store's fleet tables, the
agents' feeds), its own admin listener (admin port + worker index), and the keys' limits
shared with every other gateway through the store's leases (gateway/shared_limits.py).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import signal
import sys
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import cast

import uvloop

from gateway.route_source import StoreRouteSource
from gateway.server import serve
from gateway.settings import GatewaySettings
from store import open_store
from store.fleet import open_fleet
from workers.connect import connect_with_retry
from workers.console_cluster import TemporalClusterConsole
from workers.paths import Locations

log = logging.getLogger(__name__)

# How long stopped workers get to finish their requests before they are killed.
STOP_GRACE_S = 30.0


async def run_gateway(
    where: Locations, settings: GatewaySettings, temporal_ui: str = "", reuse_port: bool = False
) -> None:
    store = open_store(where.database_url, where.state_dir)
    # Routes come from the fleet tables in the same database: a few connections are enough
    # for one read every half second.
    fleet = open_fleet(where.database_url, where.state_dir, pool_size=2)
    client = await connect_with_retry(where)
    try:
        await fleet.init()
        await serve(
            settings,
            store,
            StoreRouteSource(fleet, client),
            TemporalClusterConsole(client, fleet, temporal_ui, where),
            reuse_port,
        )
    finally:
        await fleet.close()
        await store.close()


def _run(where: Locations, settings: GatewaySettings, temporal_ui: str, reuse_port: bool) -> None:
    # uvloop: the gateway's hot path was measured on it (docs/benchmarks.md).
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run_gateway(where, settings, temporal_ui, reuse_port))


def worker_settings(settings: GatewaySettings, index: int) -> GatewaySettings:
    """Worker `index`'s settings: the shared public port, an admin port of its own."""
    if settings.admin_port == 0:
        return settings
    return settings.model_copy(update={"admin_port": settings.admin_port + index})


def check_workers(settings: GatewaySettings, workers: int) -> None:
    if workers < 1:
        raise ValueError("--workers must be at least 1")
    if workers > 1 and settings.port == 0:
        raise ValueError("--workers above 1 needs a fixed --port for the workers to share")
    if workers > 1 and settings.admin_port and settings.admin_port + workers - 1 > 65535:
        raise ValueError("--admin-port plus --workers passes port 65535")
    if workers > 1 and settings.console_remote:
        # Console sessions live in one process's memory, and the kernel spreads a browser's
        # connections over the workers sharing the port: most requests would find no session.
        raise ValueError(
            "--console-remote needs --workers 1 (its login sessions live in one process)"
        )


def main(
    where: Locations, settings: GatewaySettings, workers: int = 1, temporal_ui: str = ""
) -> None:
    check_workers(settings, workers)
    if workers == 1:
        _run(where, settings, temporal_ui, reuse_port=False)
        return
    sys.exit(_supervise(where, settings, workers, temporal_ui))


def _supervise(where: Locations, settings: GatewaySettings, workers: int, temporal_ui: str) -> int:
    """Start the workers; when told to stop, or when one of them dies, stop them all. A
    worker that died is not replaced: the process manager restarts the gateway as a whole."""
    context = multiprocessing.get_context("spawn")  # no inherited event loop or threads
    processes: list[BaseProcess] = [
        context.Process(
            target=_run,
            args=(where, worker_settings(settings, i), temporal_ui, True),
            name=f"llmgw-gateway-{i}",
        )
        for i in range(workers)
    ]
    stopping = False

    def stop(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for process in processes:
            if process.is_alive() and process.pid is not None:
                process.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for process in processes:
        process.start()
    sentinels = {process.sentinel: process for process in processes}
    while sentinels:
        for ready in wait(list(sentinels)):
            process = sentinels.pop(cast(int, ready))
            if not stopping:
                log.error(
                    "gateway worker %s exited (%s); stopping the others",
                    process.name,
                    process.exitcode,
                )
                stop(signal.SIGTERM, None)
    for process in processes:
        process.join(STOP_GRACE_S)
        if process.is_alive():
            process.kill()
    return 0 if all(p.exitcode in (0, -signal.SIGTERM) for p in processes) else 1
