"""Stand-ins for many node agents' metrics listeners on one loopback server: each node's page is
rendered by the agent's own code (activities/agent/node_metrics.py render), so a reader sees what
a real agent serves."""

import asyncio
import contextlib
import time
from collections.abc import Callable

from aiohttp import web

from activities.agent.gpu_telemetry import TelemetryReading
from activities.agent.node_metrics import EngineLoadSample, NodeReading, render
from activities.http_site import start_site
from store.fleet import FleetTables
from workflows.contracts import (
    EngineLoad,
    NodeInventory,
    NodeRecord,
    NodeState,
    ReplicaState,
    Route,
)


def sample(
    replica_id: str, running: int, waiting: int, work: float, seen: bool = True
) -> EngineLoadSample:
    load = EngineLoad(replica_id=replica_id, running=running, waiting=waiting, work=work, seen=seen)
    return EngineLoadSample(replica_id, "llamacpp", load)


def no_gpus() -> TelemetryReading:
    return TelemetryReading([], "none")


class ManyAgents:
    """One loopback server standing in for many agents: /n/<node>/metrics is that node's page
    as the agent renders it, after `delay_s`, counting requests in flight. A node whose page
    is None is silent: it answers 503 once `silent_s` passed or `unhush` was called."""

    def __init__(
        self,
        pages: Callable[[str], NodeReading | None],
        delay_s: float = 0.0,
        silent_s: float = 2.5,
    ) -> None:
        self.pages = pages
        self.delay_s = delay_s
        self.silent_s = silent_s
        self._unhushed = asyncio.Event()
        self.in_flight = 0
        self.most_in_flight = 0
        self.served = 0
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def _page(self, request: web.Request) -> web.Response:
        node = request.match_info["node"]
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
            reading = self.pages(node)
            if reading is None:
                # An agent that does not answer within the look.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._unhushed.wait(), self.silent_s)
                return web.Response(status=503)
            self.served += 1
            return web.Response(body=render(node, reading), content_type="text/plain")
        finally:
            self.in_flight -= 1

    def unhush(self) -> None:
        """Let the silent nodes answer now."""
        self._unhushed.set()

    def url(self, node: str) -> str:
        return f"http://127.0.0.1:{self.port}/n/{node}/metrics"

    async def __aenter__(self) -> "ManyAgents":
        app = web.Application()
        app.router.add_get("/n/{node}/metrics", self._page)
        self._runner, self.port = await start_site(app, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *_: object) -> None:
        self.unhush()
        if self._runner is not None:
            await self._runner.cleanup()


def reading(samples: list[EngineLoadSample], age_s: float = 0.0) -> NodeReading:
    return NodeReading(gpus=no_gpus(), engines=samples, read_at=time.monotonic() - age_s)


async def add_node(tables: FleetTables, name: str, metrics_url: str) -> None:
    inventory = NodeInventory(name=name, metrics_url=metrics_url)
    await tables.upsert_node(NodeRecord(inventory=inventory, state=NodeState.READY))


async def add_route(
    tables: FleetTables,
    replica_id: str,
    node: str,
    model: str = "m",
    state: ReplicaState = ReplicaState.READY,
) -> None:
    route = Route(
        replica_id=replica_id,
        model=model,
        node=node,
        endpoint="http://127.0.0.1:1",
        engine="llamacpp",
        state=state,
    )
    await tables.set_route(route)
