"""The gateway of one arm of the KV routing benchmark, in a process of its own as `llmgw
gateway` runs it: the real app on a real SQLite store, with a fixed routing table read from a
JSON file (a RoutingTable, routes with or without `kv`) and the given routing policy.

    python -m bench.kv_gateway --port P --state-dir D --routes FILE --routing POLICY

Like bench/gateway/target.py it writes a fresh API key's plaintext to D/bench-api-key before
serving, unless told `--no-key` (a second gateway on the store, which takes the first's). The
store's master secret is the one the benchmark's node agent derived its node secret from, so this
gateway reads that agent's KV feed and sends its engines their keys.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import uvicorn

from bench.gateway.target import KEY_FILENAME, serve
from gateway.routing.decisions import POLICIES
from gateway.server import uvicorn_config
from gateway.settings import GatewaySettings
from store import open_store
from workflows.contracts import RoutingTable


class FileRoutes:
    """A route source whose table never changes."""

    def __init__(self, table: RoutingTable) -> None:
        self._table = table

    async def fetch(self) -> RoutingTable:
        return self._table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kv_gateway")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--routes", type=Path, required=True, help="a RoutingTable as JSON")
    parser.add_argument("--routing", choices=POLICIES, default="prefix")
    parser.add_argument(
        "--no-key", action="store_true", help="make no key: another gateway on the store did"
    )
    parser.add_argument(
        "--reuse-port", action="store_true", help="share --port with other processes (--workers)"
    )
    parser.add_argument("--own-port", type=int, help="also listen here, this process alone")
    args = parser.parse_args(argv)
    table = RoutingTable.model_validate_json(args.routes.read_text())
    model = table.routes[0].model
    settings = GatewaySettings(host="127.0.0.1", port=args.port, routing_policy=args.routing)
    store = open_store(None, args.state_dir)
    config = uvicorn_config(settings, store, FileRoutes(table))
    # The plain asyncio loop, as workers/gateway_main.py runs the gateway.
    key_file = None if args.no_key else args.state_dir / KEY_FILENAME
    asyncio.run(
        serve(uvicorn.Server(config), store, key_file, model, args.reuse_port, args.own_port)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
