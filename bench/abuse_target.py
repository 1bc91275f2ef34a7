"""The gateway under abuse: bench-gateway's target (the real app on a real SQLite store,
served by uvicorn in a process of its own, static READY routes) with the keys this benchmark
needs, written as JSON to D/bench-abuse-keys.json before serving:

  good    the well-behaved client's key (quotas no run comes near);
  abuse   the abusive clients' valid key, with the same quotas: no quota stops them, so what
          is measured is what the gateway itself does with their requests;
  budget  a key with a token budget, for the lone-surrogate bodies: a request the gateway
          refuses must not spend (or leak a reservation against) the budget.

The request-size limits are left to the gateway's defaults on every key.

    python -m bench.abuse_target --port P --upstream URL --state-dir D
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

import uvicorn

from bench.gateway.target import GENEROUS_LIMITS, MODEL, StaticRoutes, loop_factory
from gateway.server import tune_process, uvicorn_config
from gateway.settings import GatewaySettings
from store import KeyLimits, Store, open_store

KEYS_FILENAME = "bench-abuse-keys.json"
# Enough for the budget key's legitimate traffic in a long run (the stand-in bills 25 tokens a
# request), small enough that reservations leaked by refused requests exhaust it within one.
BUDGET_TOKENS = 500_000


def key_limits() -> dict[str, KeyLimits]:
    return {
        "good": GENEROUS_LIMITS,
        "abuse": GENEROUS_LIMITS,
        "budget": KeyLimits(rpm=10**9, tpm=10**12, token_budget=BUDGET_TOKENS),
    }


async def create_keys(store: Store, key_file: Path) -> None:
    await store.init()
    plaintexts = {}
    for name, limits in key_limits().items():
        # A fresh state directory each run (the caller's), so no name is taken.
        _, plaintexts[name] = await store.create_key(
            f"bench-abuse-{name}", models=[MODEL], limits=limits
        )
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(plaintexts, out)


async def serve(server: uvicorn.Server, store: Store, key_file: Path) -> None:
    try:
        await create_keys(store, key_file)
        await server.serve()
    finally:
        await store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.abuse_target")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    args.state_dir.mkdir(parents=True, exist_ok=True)
    settings = GatewaySettings(host=args.host, port=args.port)
    store = open_store(None, args.state_dir)
    config = uvicorn_config(settings, store, StaticRoutes([args.upstream]))
    server = uvicorn.Server(config)
    tune_process()  # as gateway.server.serve does
    with asyncio.Runner(loop_factory=loop_factory("uvicorn", config)) as runner:
        runner.run(serve(server, store, args.state_dir / KEYS_FILENAME))
    return 0


if __name__ == "__main__":
    sys.exit(main())
