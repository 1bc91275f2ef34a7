"""Where the routing table comes from, and the loop that keeps the gateway's copy fresh.

The ledger workflow owns the table; the gateway queries it in the background and requests read
only the in-memory snapshot, so a slow or unreachable Temporal never delays a request: the last
good table keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta
from typing import Protocol, runtime_checkable

from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from gateway.route_book import RouteBook, add_page, apply_delta, start_book
from gateway.routing import RoutingSnapshot
from workflows import model_client
from workflows.contracts import (
    ModelSpec,
    ModelView,
    ModelWake,
    RoutingTable,
    RoutingTableRequest,
)
from workflows.ledger import ClusterLedgerWorkflow
from workflows.ledger_cells import merge_routes
from workflows.model import ModelWorkflow
from workflows.names import ledger_cell_workflow_id

log = logging.getLogger(__name__)
# A whole table of 200 pages is 200,000 routes (workflows/route_log.py: PAGE_ROUTES): more is a
# ledger answering wrongly, not a fleet.
MAX_PAGES = 200


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


class CellTable:
    """One ledger cell's table, kept up to date by queries (a query is not recorded in history
    and costs a few milliseconds). It says which table it holds, and the cell sends nothing
    when no route changed, the routes that changed when it can, and otherwise the whole table
    a page at a time (route_book.py, workflows/route_log.py)."""

    def __init__(self, client: Client, cell: int, rpc_timeout: timedelta) -> None:
        self._handle: WorkflowHandle[ClusterLedgerWorkflow, None] = client.get_workflow_handle(
            ledger_cell_workflow_id(cell)
        )
        self._cell = cell
        self._rpc_timeout = rpc_timeout
        self._book: RouteBook | None = None
        self._table: RoutingTable | None = None

    async def fetch(self) -> RoutingTable:
        """The cell's table; the same object as last time when no route in it changed."""
        try:
            return await self._fetch()
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND or self._cell == 0:
                raise
        # A cell none of whose nodes has registered yet has no ledger: no routes.
        if self._table is None or self._table.routes or self._book is not None:
            self._book, self._table = None, RoutingTable()
        return self._table

    async def _fetch(self) -> RoutingTable:
        whole = RoutingTableRequest(deltas=True)
        book = self._book
        answer = await self._ask(book.asking() if book is not None else whole)
        if book is not None and self._table is not None and (answer.delta or answer.unchanged):
            updated = apply_delta(book, answer)
            if updated is book:
                # No route changed: the same object, so the refresher keeps its snapshot
                # without comparing.
                self._table.version = book.version
                self._table.cells = answer.cells
                return self._table
            if updated is not None:
                return self._hold(updated, answer.cells)
            log.info(
                "routing table of ledger cell %d does not follow version %d: reading it whole",
                self._cell,
                book.version,
            )
            answer = await self._ask(whole)
        return self._hold(await self._read_whole(answer), answer.cells)

    async def _read_whole(self, first: RoutingTable) -> RouteBook:
        """The whole table from its first page: the later pages, then a delta for whatever
        changed while they were read."""
        book = start_book(first)
        cursor, pages = first.next_after, 1
        while cursor:
            if pages >= MAX_PAGES:
                raise ValueError(f"routing table longer than {MAX_PAGES} pages")
            page = await self._ask(RoutingTableRequest(epoch=book.epoch, deltas=True, after=cursor))
            add_page(book, page)
            cursor, pages = page.next_after, pages + 1
        if pages > 1:
            # One that does not follow (too much changed meanwhile) leaves the book at its
            # first page's version, and the next fetch asks from there.
            book = apply_delta(book, await self._ask(book.asking())) or book
        return book

    async def _ask(self, request: RoutingTableRequest) -> RoutingTable:
        table = await self._handle.query(
            ClusterLedgerWorkflow.routing_table, args=[request], rpc_timeout=self._rpc_timeout
        )
        if not isinstance(table, RoutingTable):
            raise TypeError(f"ledger answered {type(table).__name__}, not RoutingTable")
        return table

    def _hold(self, book: RouteBook, cells: int) -> RoutingTable:
        self._book = book
        self._table = book.table()
        self._table.cells = cells
        return self._table


class TemporalRouteSource:
    """Reads the routing table from the ledger: from cell 0 (`cluster`), which says how many
    cells there are, and from every other cell (workflows/ledger_cells.py), merged. The merged
    table is the same object while no cell's routes changed."""

    def __init__(self, client: Client, rpc_timeout: timedelta = timedelta(seconds=2)) -> None:
        self._client = client
        self._rpc_timeout = rpc_timeout
        self._cells: list[CellTable] = []
        self._held: list[RoutingTable] = []
        self._merged: RoutingTable | None = None

    def _cell(self, cell: int) -> CellTable:
        while len(self._cells) <= cell:
            self._cells.append(CellTable(self._client, len(self._cells), self._rpc_timeout))
        return self._cells[cell]

    async def fetch(self) -> RoutingTable:
        first = await self._cell(0).fetch()
        if first.cells <= 1:
            return first
        rest = await asyncio.gather(*(self._cell(c).fetch() for c in range(1, first.cells)))
        tables = [first, *rest]
        merged = self._merged
        if merged is not None and _same(tables, self._held):
            merged.version = sum(t.version for t in tables)
            return merged
        self._held = tables
        # Versions count within each cell; their sum grows with any of them, which is all a
        # reader of the merged table (the gateway's status, its engine scrape) asks of it.
        self._merged = RoutingTable.model_construct(
            version=sum(t.version for t in tables),
            epoch=first.epoch,
            routes=list(merge_routes(t.routes for t in tables).values()),
            idle_models=list(first.idle_models),
            cells=first.cells,
        )
        return self._merged

    async def apply_model(self, spec: ModelSpec) -> ModelView:
        return await model_client.apply_model(self._client, spec)

    async def list_models(self) -> list[ModelView]:
        return await model_client.list_models(self._client)

    async def wake(self, model: str) -> None:
        handle = model_client.model_handle(self._client, model)
        await handle.signal(ModelWorkflow.wake, ModelWake(), rpc_timeout=self._rpc_timeout)


def _same(tables: list[RoutingTable], held: list[RoutingTable]) -> bool:
    """Every cell answered with the table it held: no route changed anywhere."""
    return len(tables) == len(held) and all(a is b for a, b in zip(tables, held, strict=True))


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
