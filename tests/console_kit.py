"""The gateway serving the web console against the stand-in cluster (tests/console_standin.py),
on an event loop of its own thread: selenium is synchronous, and a browser test must not hold
the loop the gateway answers on. A real SQLite store, a model catalog stand-in (PUT
/admin/v1/models) and the real app; only Temporal and the node agents are stood in."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import uvicorn

from gateway.deps import GatewayState
from gateway.server import uvicorn_config
from gateway.settings import GatewaySettings
from store import KeyLimits, Store, UsageDelta, open_store
from tests.browser_kit import by_css, until
from tests.console_standin import StandinCluster
from tests.gateway_kit import CatalogSource, fast_settings


@dataclass
class ConsoleGateway:
    url: str
    cluster: StandinCluster
    catalog: CatalogSource
    store: Store
    loop: asyncio.AbstractEventLoop
    app: Any  # the FrontDoor: its FastAPI app holds the gateway's state

    @property
    def state(self) -> GatewayState:
        state: GatewayState = self.app.api.state.gateway
        return state

    @property
    def console(self) -> str:
        return f"{self.url}/admin/console/"

    def call(self, coro: Any) -> Any:
        """Run a coroutine on the gateway's loop (the store belongs to it)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)


USAGE_KEY = "team-a"
USAGE_DAYS = 5


async def seed_usage(store: Store) -> None:
    """A key with a few days of use on two models, as the gateway would have recorded it."""
    record, _ = await store.create_key(USAGE_KEY, limits=KeyLimits(token_budget=2_000_000))
    today = datetime.now(UTC).date()
    rows = []
    for back in range(USAGE_DAYS):
        day = today - timedelta(days=back)
        for model, scale in (("deepseek", 3), ("qwen", 1)):
            rows.append(
                UsageDelta(
                    key_id=record.key_id,
                    model=model,
                    day=day,
                    requests=10 * scale * (back + 1),
                    prompt_tokens=4000 * scale * (back + 1),
                    completion_tokens=1000 * scale * (back + 1),
                )
            )
    await store.add_usage(rows)


@contextmanager
def console_gateway(
    state_dir: Path, settings: GatewaySettings | None = None
) -> Iterator[ConsoleGateway]:
    ready = threading.Event()
    held: dict[str, Any] = {}

    async def run() -> None:
        store = open_store(None, state_dir)
        cluster = StandinCluster(state_dir)
        catalog = CatalogSource()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn_config(settings or fast_settings(), store, catalog, None, cluster)
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            while not server.started:
                if task.done():
                    task.result()
                await asyncio.sleep(0.01)
            await seed_usage(store)
            held["gateway"] = ConsoleGateway(
                f"http://127.0.0.1:{port}",
                cluster,
                catalog,
                store,
                asyncio.get_running_loop(),
                config.app,
            )
            held["stop"] = asyncio.Event()
            ready.set()
            await held["stop"].wait()
        finally:
            server.should_exit = True
            await asyncio.wait_for(task, 10)
            sock.close()
            await store.close()

    thread = threading.Thread(target=asyncio.run, args=(run(),), daemon=True)
    thread.start()
    if not ready.wait(30):
        raise RuntimeError("the console's gateway did not start")
    gateway: ConsoleGateway = held["gateway"]
    try:
        yield gateway
    finally:
        gateway.loop.call_soon_threadsafe(held["stop"].set)
        thread.join(15)


def open_page(driver: Any, gateway: ConsoleGateway, page: str) -> None:
    driver.get(f"{gateway.console}#{page}")
    until(lambda: "Updated" in by_css(driver, "#freshness").text, "its first update")


def region(driver: Any, page: str) -> str:
    return str(by_css(driver, f"#{page}-data").text)
