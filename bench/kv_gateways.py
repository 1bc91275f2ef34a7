"""The KV routing benchmark's gateways (bench/kv_routing.py): each arm's gateway processes on
one store (bench/kv_gateway.py), several per gateway with --workers, and the last one restarted
on demand (--restart)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from bench.gateway.procs import gateway_child
from bench.gateway.target import KEY_FILENAME
from engines.local_port import free_port
from workflows.contracts import Route, RoutingTable

GATEWAY_START_S = 120.0


@dataclass
class Front:
    """One gateway: where requests go (a port its worker processes share) and each process's
    own port, for its /metrics."""

    base: str
    processes: list[str]
    stack: contextlib.AsyncExitStack


class Fronts:
    """The arm's gateways on one store, each request to the next in turn (as a load balancer
    spreads them), with the API key the first made."""

    def __init__(self, state: Path, routes: list[Route], policy: str, workers: int) -> None:
        self._state, self._routes, self._policy, self._workers = state, routes, policy, workers
        self.gateways: list[Front] = []
        self.key = ""
        self.restarted: Front | None = None

    def target(self, index: int) -> tuple[str, str]:
        return self.gateways[index % len(self.gateways)].base, self.key

    def processes(self) -> list[str]:
        return [base for front in self.gateways for base in front.processes]

    async def start(self) -> Front:
        stack = contextlib.AsyncExitStack()
        port = free_port()
        front = Front(f"http://127.0.0.1:{port}", [], stack)
        try:
            for _ in range(self._workers):
                own = free_port() if self._workers > 1 else port
                make_key = not self.key
                key = await stack.enter_async_context(
                    gateway(self._state, self._routes, self._policy, make_key, port, own)
                )
                self.key = self.key or key
                front.processes.append(f"http://127.0.0.1:{own}")
        except BaseException:
            await stack.aclose()
            raise
        return front

    async def restart_last(self) -> None:
        """Stop the last gateway's processes and start it again, on a new port; it takes the
        others' record before it serves (gateway/peers/)."""
        await self.gateways[-1].stack.aclose()
        self.gateways[-1] = self.restarted = await self.start()

    async def close(self) -> None:
        for front in self.gateways:
            await front.stack.aclose()


@contextlib.asynccontextmanager
async def gateways(
    state: Path, routes: list[Route], policy: str, count: int, workers: int = 1
) -> AsyncIterator[Fronts]:
    """`count` real gateways on one store, each of `workers` processes of its own (the load
    generator would otherwise bill them for the client's work), on `routes` with `policy`."""
    fronts = Fronts(state, routes, policy, workers)
    try:
        for _ in range(count):
            fronts.gateways.append(await fronts.start())
        yield fronts
    finally:
        await fronts.close()


@contextlib.asynccontextmanager
async def gateway(
    state: Path, routes: list[Route], policy: str, make_key: bool, port: int, own_port: int
) -> AsyncIterator[str]:
    """One gateway process on `port` (shared with others when `own_port` differs); yields the
    API key it made (`make_key`; else "": it serves the one another gateway on the store made)
    once its routes are loaded."""
    routes_file = state / f"routes-{own_port}.json"
    routes_file.write_text(RoutingTable(version=1, routes=routes).model_dump_json())
    argv = [sys.executable, "-m", "bench.kv_gateway", "--port", str(port)]
    argv += ["--state-dir", str(state / "gateway"), "--routes", str(routes_file)]
    argv += ["--routing", policy] + ([] if make_key else ["--no-key"])
    if own_port != port:
        argv += ["--reuse-port", "--own-port", str(own_port)]
    key_file = state / "gateway" / KEY_FILENAME if make_key else None
    log = state / f"gateway-{own_port}.log"
    async with gateway_child(argv, log, own_port, key_file, GATEWAY_START_S) as api_key:
        yield api_key
