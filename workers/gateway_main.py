"""`llmgw gateway`: the OpenAI front door, reading routes from the ledger in the background."""

import asyncio

import uvloop

from gateway.route_source import TemporalRouteSource
from gateway.server import serve
from gateway.settings import GatewaySettings
from gateway.store import open_store
from workers.connect import connect_with_retry
from workers.console_cluster import TemporalClusterConsole
from workers.paths import Locations


async def run_gateway(where: Locations, settings: GatewaySettings, temporal_ui: str = "") -> None:
    store = open_store(where.database_url, where.state_dir)
    client = await connect_with_retry(where)
    try:
        await serve(
            settings,
            store,
            TemporalRouteSource(client),
            TemporalClusterConsole(client, temporal_ui),
        )
    finally:
        await store.close()


def main(where: Locations, settings: GatewaySettings, temporal_ui: str = "") -> None:
    # uvloop: the gateway's hot path was measured on it (docs/benchmarks.md).
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run_gateway(where, settings, temporal_ui))
