"""The gateway of the fairness benchmark, in a process of its own as `llmgw gateway` runs it:
the real app on a real SQLite store, a fixed table of READY llama.cpp routes (`bench-0`,
`bench-1`, ... on node N, whose keys the gateway derives from the store's master secret, as in
production; `--slots`: each route says its engine's -np, as a llama.cpp replica's does, and
that is its depth in the fair queue), and the fair queue on or off.

    python -m bench.fairness_gateway --port P --state-dir D --model M --node N
        --upstream URL [--upstream URL ...] [--slots N] [--no-fair-queue] [--no-keys]
        [--queue-aging-s S]

Before serving it makes the benchmark's keys and writes their plaintexts as JSON to
D/bench-fairness-keys.json: `flood` (weight 1, batch at most) and `interactive-0..2` (weight 1,
interactive at most), with quotas no run comes near. `--no-keys`: another gateway on the same
state directory made them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

import uvicorn

from bench.gateway.target import StaticRoutes
from gateway.server import uvicorn_config
from gateway.settings import GatewaySettings
from store import KeyLimits, Store, open_store
from store.models import PriorityClass
from workflows.contracts import RoutingTable

KEYS_FILENAME = "bench-fairness-keys.json"
FLOOD_KEY = "flood"
INTERACTIVE_KEYS = tuple(f"interactive-{n}" for n in range(3))
# Quotas checked on every request that no run comes near.
_QUOTAS = {"rpm": 10**9, "tpm": 10**12, "token_budget": 10**15}


class SlotRoutes:
    """StaticRoutes' table with each route's llama.cpp slots, as a real route says them
    (Route.slots, from the profile's -np): the fair queue's depth for the replica."""

    def __init__(self, routes: StaticRoutes, slots: int | None) -> None:
        self._routes = routes
        self._slots = slots

    async def fetch(self) -> RoutingTable:
        table = await self._routes.fetch()
        if self._slots is None:
            return table
        routes = [route.model_copy(update={"slots": self._slots}) for route in table.routes]
        return table.model_copy(update={"routes": routes})


def key_limits() -> dict[str, KeyLimits]:
    top: dict[str, PriorityClass] = {FLOOD_KEY: "batch"}
    return {
        name: KeyLimits(**_QUOTAS, weight=1.0, top_priority=top.get(name, "interactive"))
        for name in (FLOOD_KEY, *INTERACTIVE_KEYS)
    }


async def create_keys(store: Store, key_file: Path, model: str) -> None:
    plaintexts = {}
    for name, limits in key_limits().items():
        # A fresh state directory each run (the benchmark's own), so no name is taken.
        _, plaintexts[name] = await store.create_key(f"bench-{name}", models=[model], limits=limits)
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(plaintexts, out)


async def serve(server: uvicorn.Server, store: Store, key_file: Path | None, model: str) -> None:
    try:
        await store.init()
        if key_file is not None:
            await create_keys(store, key_file, model)
        await server.serve()
    finally:
        await store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fairness_gateway")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--upstream", action="append", required=True)
    parser.add_argument("--no-fair-queue", action="store_true")
    parser.add_argument("--no-keys", action="store_true", help="another gateway made them")
    parser.add_argument("--queue-aging-s", type=float, help="else the gateway's default")
    parser.add_argument("--slots", type=int, help="each engine's -np, as its route says")
    args = parser.parse_args(argv)
    settings = GatewaySettings(host="127.0.0.1", port=args.port, fair_queue=not args.no_fair_queue)
    if args.queue_aging_s is not None:
        settings = settings.model_copy(update={"queue_aging_s": args.queue_aging_s})
    store = open_store(None, args.state_dir)
    routes = SlotRoutes(StaticRoutes(args.upstream, args.model, "llamacpp", args.node), args.slots)
    config = uvicorn_config(settings, store, routes)
    key_file = None if args.no_keys else args.state_dir / KEYS_FILENAME
    # The plain asyncio loop, as workers/gateway_main.py runs the gateway.
    asyncio.run(serve(uvicorn.Server(config), store, key_file, args.model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
