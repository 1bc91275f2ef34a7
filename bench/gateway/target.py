"""The gateway under test: the real app, served the way `llmgw gateway` serves it, with a real
SQLite store and a static routing table of READY routes, one per `--upstream`.

    python -m bench.gateway.target --port P --upstream URL [--upstream URL ...]
        --state-dir D [--model M --engine E --node N --routing POLICY]

Creates an API key named `bench` through the store and writes its plaintext to
D/bench-api-key before serving, for the load generator to send as `Authorization: Bearer`
(`--no-key`: another process on the same state directory made it). `--reuse-port` binds the
port with SO_REUSEPORT, as each worker of `llmgw gateway --workers N` does, so several targets
can share it and the store.
Everything per request stays on: key check, model allowlist, routing, in-flight counts, usage
recording and its flush loop. The replicas are `bench-0`, `bench-1`, ... on node N; for an
engine that llmgw keys (llamacpp), the gateway derives each one's key from the store's master
secret as it does in production, so the engines must have been started with those keys.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path

import uvicorn

from gateway.routing.decisions import POLICIES
from gateway.server import listen, tune_process, uvicorn_config
from gateway.settings import GatewaySettings
from store import KeyLimits, KeyNameTaken, Store, open_store
from workflows.contracts import ReplicaState, Route, RoutingTable

MODEL = "mock"
KEY_NAME = "bench"
KEY_FILENAME = "bench-api-key"
# Limits that quota checks on every request but that no run comes near: a 5 s window at 64
# in flight is well under a million requests and 10^8 tokens.
GENEROUS_LIMITS = KeyLimits(rpm=10**9, tpm=10**12, token_budget=10**15)
# uvicorn's own choice (uvloop when installed, as `uvicorn.Server.run` does), or the plain
# asyncio loop that `asyncio.run(...)` gives, as workers/gateway_main.py runs it today.
LOOPS = ("uvicorn", "asyncio")


class StaticRoutes:
    """A route source whose table never changes: one READY replica per upstream."""

    def __init__(
        self,
        upstreams: list[str],
        model: str = MODEL,
        engine: str = "external",
        node: str = "bench",
        prompt_slots: int | None = None,
    ) -> None:
        self._table = RoutingTable(
            version=1,
            routes=[
                Route(
                    replica_id=f"bench-{index}",
                    model=model,
                    node=node,
                    endpoint=upstream,
                    engine=engine,
                    state=ReplicaState.READY,
                    prompt_slots=prompt_slots,
                )
                for index, upstream in enumerate(upstreams)
            ],
        )

    async def fetch(self) -> RoutingTable:
        return self._table


async def create_key(store: Store, key_file: Path, model: str) -> None:
    await store.init()
    try:
        _, plaintext = await store.create_key(KEY_NAME, models=[model], limits=GENEROUS_LIMITS)
    except KeyNameTaken:
        # A state directory used before: its plaintext key is gone, so make a fresh one.
        await store.revoke_key(KEY_NAME)
        _, plaintext = await store.create_key(KEY_NAME, models=[model], limits=GENEROUS_LIMITS)
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(plaintext + "\n")


async def serve(
    server: uvicorn.Server,
    store: Store,
    key_file: Path | None,
    model: str,
    reuse_port: bool = False,
    own_port: int | None = None,
) -> None:
    """`reuse_port`: the port is shared with other processes (as `llmgw gateway --workers`
    shares it); `own_port`: a second port this process alone listens on, so its own /metrics
    can be read."""
    config = server.config
    try:
        if key_file is not None:
            await create_key(store, key_file, model)
        if reuse_port or own_port is not None:
            socks = [listen(config.host, config.port, reuse_port=reuse_port)]
            if own_port is not None:
                socks.append(listen(config.host, own_port))
            try:
                await server.serve(sockets=socks)
            finally:
                for sock in socks:
                    sock.close()
        else:
            await server.serve()
    finally:
        await store.close()


def loop_factory(
    loop: str, config: uvicorn.Config
) -> Callable[[], asyncio.AbstractEventLoop] | None:
    return config.get_loop_factory() if loop == "uvicorn" else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway.target")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--upstream", action="append", required=True, help="a replica's base URL (repeatable)"
    )
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--loop", choices=LOOPS, default="uvicorn")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--engine", default="external")
    parser.add_argument("--node", default="bench")
    parser.add_argument("--routing", choices=POLICIES, default="prefix")
    parser.add_argument(
        "--prompt-slots",
        type=int,
        help="the engines' slots are their whole prompt cache (llama.cpp's --cache-ram 0)",
    )
    parser.add_argument("--reuse-port", action="store_true", help="share the port (SO_REUSEPORT)")
    parser.add_argument("--no-key", action="store_true", help="do not create the bench key")
    parser.add_argument(
        "--own-port",
        type=int,
        help="also listen on this port alone (with --reuse-port: to tell this process is up)",
    )
    parser.add_argument("--otlp-endpoint", default="", help="trace to this OTLP/HTTP receiver")
    parser.add_argument(
        "--database-url", default="", help="the store (postgresql://...); else SQLite in state-dir"
    )
    args = parser.parse_args(argv)
    args.state_dir.mkdir(parents=True, exist_ok=True)
    settings = GatewaySettings(
        host=args.host,
        port=args.port,
        routing_policy=args.routing,
        otlp_endpoint=args.otlp_endpoint,
    )
    store = open_store(args.database_url or None, args.state_dir)
    routes = StaticRoutes(args.upstream, args.model, args.engine, args.node, args.prompt_slots)
    config = uvicorn_config(settings, store, routes)
    server = uvicorn.Server(config)
    tune_process()  # as gateway.server.serve does
    with asyncio.Runner(loop_factory=loop_factory(args.loop, config)) as runner:
        key_file = None if args.no_key else args.state_dir / KEY_FILENAME
        runner.run(serve(server, store, key_file, args.model, args.reuse_port, args.own_port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
