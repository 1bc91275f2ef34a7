"""Where the routing table comes from, and the loop that keeps the gateway's copy fresh.

The replica workflows write their routes into the fleet tables of the store; the gateway reads
them in the background by version and requests read only the in-memory snapshot, so a slow or
unreachable store never delays a request: the last good table keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta
from typing import Protocol, runtime_checkable

from temporalio.client import Client

from gateway.route_book import RouteBook, apply_delta, start_book
from gateway.routing import RoutingSnapshot
from store.fleet import FleetTables
from workflows.contracts import ModelSpec, ModelView, ModelWake, RoutingTable
from workflows.model import client as model_client
from workflows.model.api import ModelApi

log = logging.getLogger(__name__)
WAKE_TIMEOUT = timedelta(seconds=2)


class RouteSource(Protocol):
    async def fetch(self) -> RoutingTable: ...


@runtime_checkable
class ModelWaker(Protocol):
    """A source that can also ask a model at zero replicas to start one."""

    async def wake(self, model: str) -> None: ...


@runtime_checkable
class ModelCatalog(Protocol):
    """A source that also defines models (the admin API's PUT /admin/v1/models/NAME)."""

    async def apply_model(self, spec: ModelSpec) -> ModelView: ...

    async def list_models(self) -> list[ModelView]: ...


class StoreRouteSource:
    """Reads the routing table from the fleet tables in the store (store/fleet/tables.py): the
    whole table once, then by version: one indexed read when no route changed, the routes that
    changed and the ids removed when one did, the whole table again only when this gateway fell
    behind the tables' pruned tombstones or the store is another one (its epoch). The table is
    the same object while nothing changed. Models are applied, listed and woken through
    Temporal, where their workflows run."""

    def __init__(self, tables: FleetTables, client: Client | None = None) -> None:
        self._tables = tables
        self._client = client
        self._book: RouteBook | None = None
        self._table: RoutingTable | None = None

    async def fetch(self) -> RoutingTable:
        book = self._book
        answer = await self._tables.routing_table(book.asking() if book is not None else None)
        if book is not None and self._table is not None:
            updated = apply_delta(book, answer)
            if updated is book:
                # No route changed: the same object, so the refresher keeps its snapshot
                # without comparing.
                self._table.version = book.version
                return self._table
            if updated is not None:
                return self._hold(updated)
            if answer.delta or answer.unchanged:
                log.info("routing table does not follow version %d: reading it whole", book.version)
                answer = await self._tables.routing_table(None)
        return self._hold(start_book(answer))

    def _hold(self, book: RouteBook) -> RoutingTable:
        self._book = book
        self._table = book.table()
        return self._table

    def _temporal(self) -> Client:
        if self._client is None:
            raise RuntimeError("this gateway has no Temporal client: models cannot be changed")
        return self._client

    async def apply_model(self, spec: ModelSpec) -> ModelView:
        return await model_client.apply_model(self._temporal(), spec)

    async def list_models(self) -> list[ModelView]:
        return await model_client.list_models(self._temporal())

    async def wake(self, model: str) -> None:
        handle = model_client.model_handle(self._temporal(), model)
        await handle.signal(ModelApi.wake, ModelWake(), rpc_timeout=WAKE_TIMEOUT)


class RouteRefresher:
    """Holds the current snapshot and replaces it when the source returns a different table."""

    def __init__(self, source: RouteSource, timeout_s: float = 2.0) -> None:
        self._source = source
        self._timeout_s = timeout_s
        self.snapshot = RoutingSnapshot(RoutingTable())
        self.last_success: float | None = None  # time.monotonic() of the last good fetch
        self.last_error: str | None = None
        # model -> time.monotonic() of the last wake sent for it.
        self._woken: dict[str, float] = {}

    async def refresh(self) -> bool:
        """One fetch; True if it succeeded. Failures keep the previous table."""
        try:
            # asyncio.timeout rather than wait_for: on 3.11, wait_for can swallow a
            # cancellation that lands as the fetch completes, and the loop would never stop.
            async with asyncio.timeout(self._timeout_s):
                table = await self._source.fetch()
        except Exception as exc:  # noqa: BLE001 - any failed fetch keeps the last table
            reason = f"{type(exc).__name__}: {exc}"
            if self.last_error is None:
                # Logged on the change only: an outage would otherwise log twice a second.
                log.warning("routing table refresh failed, keeping the last one: %s", reason)
            self.last_error = reason
            return False
        if self.last_error is not None:
            log.info("routing table refresh recovered (version %d)", table.version)
        self.last_error = None
        self.last_success = time.monotonic()
        # An unchanged table keeps its snapshot: nothing to rebuild. The identity check first:
        # comparing 4,000 routes field by field twice a second is work for nothing.
        if table is not self.snapshot.table and table != self.snapshot.table:
            self.snapshot = RoutingSnapshot(table)
        return True

    async def wake(self, model: str, every_s: float = 5.0) -> None:
        """Ask for a replica of an idle model; at most once per `every_s` per model, however
        many requests are waiting for it."""
        now = time.monotonic()
        if now - self._woken.get(model, -every_s) < every_s:
            return
        self._woken[model] = now
        if isinstance(self._source, ModelWaker):
            try:
                await self._source.wake(model)
            except Exception as exc:  # noqa: BLE001 - best effort, the next request asks again
                log.warning("could not wake model %s: %s", model, exc)

    def warming(self, model: str, within_s: float) -> bool:
        """Woken within the last `within_s`: its replica is on its way."""
        woken = self._woken.get(model)
        return woken is not None and time.monotonic() - woken < within_s

    @property
    def source(self) -> RouteSource:
        return self._source

    def age_s(self) -> float | None:
        return None if self.last_success is None else time.monotonic() - self.last_success
