"""The gateway bench.routing measures, in a process of its own as `llmgw gateway` runs it:
bench.gateway.target's real app on a real SQLite store and its fixed table of READY llama.cpp
routes (`bench-0`, `bench-1`, ... on node N, keyed from the store's master secret as in
production), with the routing settings an arm names: the policy, the TTFT target of sticky
routing (docs/sticky-routing.md) and the fair queue on or off.

    python -m bench.routing_gateway --port P --state-dir D --model M --node N
        --upstream URL [--upstream URL ...] --routing POLICY [--ttft-target-s S]
        [--no-fair-queue] [--prompt-slots N]

Writes the bench key's plaintext to D/bench-api-key before serving, as bench.gateway.target
does. `gateway` below starts it and waits until it serves; `decision_cost_us` times its router's
choice alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import timeit
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import uvicorn

from bench.gateway.procs import gateway_child
from bench.gateway.target import KEY_FILENAME, StaticRoutes, serve
from bench.routing_engines import HEALTH_TIMEOUT_S, Engine
from engines.local_port import free_port
from gateway.routing import PrefixIndex, RequestKey, Router, RoutingSnapshot
from gateway.routing.decisions import POLICIES
from gateway.server import uvicorn_config
from gateway.settings import GatewaySettings
from store import open_store
from workflows.contracts import ReplicaState, Route, RoutingTable


@contextlib.asynccontextmanager
async def gateway(
    state: Path,
    engine_list: Sequence[Engine],
    routing: tuple[str, float | None, bool],
    prompt_slots: int | None,
    model: str,
    node: str,
    make_key: bool = True,
) -> AsyncIterator[tuple[str, str]]:
    """The gateway in a process of its own, routing to `engine_list` by `routing` (policy, TTFT
    target or None for the setting's default, fair queue); yields its base URL and the API key
    it made (`make_key`; else "": another gateway on the store made one). Its own process, as
    in production: in this one it would share an event loop with the load generator and bill
    the gateway for the client's work."""
    policy, ttft_target_s, fair_queue = routing
    port = free_port()
    argv = [sys.executable, "-m", "bench.routing_gateway", "--port", str(port)]
    argv += ["--state-dir", str(state), "--model", model, "--node", node, "--routing", policy]
    if ttft_target_s is not None:
        argv += ["--ttft-target-s", str(ttft_target_s)]
    if not fair_queue:
        argv.append("--no-fair-queue")
    if prompt_slots is not None:
        argv += ["--prompt-slots", str(prompt_slots)]
    if not make_key:
        argv.append("--no-key")
    for engine in engine_list:
        argv += ["--upstream", engine.url]
    key_file = state / KEY_FILENAME if make_key else None
    log = state / f"gateway-{policy}-{port}.log"
    async with gateway_child(argv, log, port, key_file, HEALTH_TIMEOUT_S) as api_key:
        yield f"http://127.0.0.1:{port}", api_key


def gateway_settings(
    port: int, policy: str, ttft_target_s: float | None, fair_queue: bool
) -> GatewaySettings:
    """The settings the arm's gateway serves with; the app gives its Router the TTFT target and
    prefill rate they carry (gateway/app.py). `ttft_target_s` None: the setting's default."""
    settings = GatewaySettings(
        host="127.0.0.1", port=port, routing_policy=policy, fair_queue=fair_queue
    )
    if ttft_target_s is None:
        return settings
    return settings.model_copy(update={"routing_ttft_target_s": ttft_target_s})


def decision_cost_us(
    replicas: int = 5, prompt_bytes: int = 4096, ttft_target_s: float = 0.0
) -> float:
    """Microseconds per `Router.choose` on the hot path: a 4 KB prompt whose first 3 KB is one
    of 20 shared system prompts, `replicas` replicas, the index held at its bound (20,000
    claims here, so every request also evicts) to include eviction in the cost; with a TTFT
    target, each holder judged by its pending tokens."""
    rng = random.Random(1)
    routes = [
        Route(
            replica_id=f"r-{i}",
            model="m",
            node="n",
            endpoint="http://127.0.0.1:1",
            engine="llamacpp",
            state=ReplicaState.READY,
        )
        for i in range(replicas)
    ]
    snap = RoutingSnapshot(RoutingTable(version=1, routes=routes))
    shared = [rng.randbytes(prompt_bytes * 3 // 4) for _ in range(20)]
    keys = [
        RequestKey("m", rng.choice(shared) + rng.randbytes(prompt_bytes // 4)) for _ in range(4000)
    ]
    router = Router(index=PrefixIndex(max_claims=20_000), ttft_target_s=ttft_target_s)
    inflight = {"r-0": 2, "r-1": 1}
    for key in keys:
        router.choose(snap, key, inflight)
    stream = iter(keys * 30)
    runs = timeit.repeat(lambda: router.choose(snap, next(stream), inflight), number=5000, repeat=5)
    return min(runs) / 5000 * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.routing_gateway")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--upstream", action="append", required=True)
    parser.add_argument("--routing", choices=POLICIES, default="prefix")
    parser.add_argument("--ttft-target-s", type=float, help="else the gateway's default")
    parser.add_argument("--no-fair-queue", action="store_true")
    parser.add_argument("--prompt-slots", type=int, help="the engines' slots are their cache")
    parser.add_argument("--no-key", action="store_true", help="another gateway made the key")
    args = parser.parse_args(argv)
    settings = gateway_settings(
        args.port, args.routing, args.ttft_target_s, fair_queue=not args.no_fair_queue
    )
    store = open_store(None, args.state_dir)
    routes = StaticRoutes(args.upstream, args.model, "llamacpp", args.node, args.prompt_slots)
    server = uvicorn.Server(uvicorn_config(settings, store, routes))
    # The plain asyncio loop, as workers/gateway_main.py runs the gateway.
    key_file = None if args.no_key else args.state_dir / KEY_FILENAME
    asyncio.run(serve(server, store, key_file, args.model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
