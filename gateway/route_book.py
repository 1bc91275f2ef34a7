"""The gateway's copy of the routing table, kept up to date from the ledger's answers.

The ledger (workflows/route_log.py) answers a gateway that takes deltas with nothing new, the
routes changed since the gateway's version, or a page of the whole table. This is the pure part
of applying those: which answer follows the copy and which means fetching the whole table
again. TemporalRouteSource (route_source.py) does the asking.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workflows.contracts import Route, RoutingTable, RoutingTableRequest


@dataclass
class RouteBook:
    """One ledger's table (epoch) as of one version, by replica id."""

    epoch: str
    version: int
    routes: dict[str, Route] = field(default_factory=dict)
    idle_models: list[str] = field(default_factory=list)

    def asking(self) -> RoutingTableRequest:
        """What the gateway asks with while it holds this book."""
        return RoutingTableRequest(epoch=self.epoch, version=self.version, deltas=True)

    def table(self) -> RoutingTable:
        # Every route was validated when its answer was: not again for each of 40,000 routes
        # whenever one changes.
        return RoutingTable.model_construct(
            version=self.version,
            epoch=self.epoch,
            routes=list(self.routes.values()),
            idle_models=list(self.idle_models),
        )


def follows(book: RouteBook, answer: RoutingTable) -> bool:
    """The answer is a delta or `unchanged` from exactly this book's epoch and version. Any
    other (another ledger, a version the book does not hold) means fetching the whole table:
    applying it would leave routes the book missed, or keep ones it should have dropped."""
    if answer.epoch != book.epoch:
        return False
    if answer.unchanged:
        return answer.version >= book.version
    return answer.delta and answer.since == book.version and answer.version >= book.version


def apply_delta(book: RouteBook, answer: RoutingTable) -> RouteBook | None:
    """The book after this answer, a new object when a route changed and the same one (at the
    new version) when none did; None when the answer does not follow it (see follows())."""
    if not follows(book, answer):
        return None
    if answer.unchanged:
        book.version = answer.version
        return book
    routes = dict(book.routes)
    for replica in answer.removed:
        routes.pop(replica, None)
    for route in answer.routes:
        routes[route.replica_id] = route
    return RouteBook(answer.epoch, answer.version, routes, list(answer.idle_models))


def start_book(first: RoutingTable) -> RouteBook:
    """A book from the first page of a whole table. It holds that page's version: a delta
    asked from there brings whatever changed while the later pages were read."""
    if first.delta or first.unchanged:
        raise ValueError("a whole table's first page was wanted, not a delta")
    routes = {r.replica_id: r for r in first.routes}
    return RouteBook(first.epoch, first.version, routes, list(first.idle_models))


def add_page(book: RouteBook, page: RoutingTable) -> None:
    """A later page of the same whole table. A page from another ledger (it was started afresh
    while the gateway paged) cannot be mixed in: ValueError, and the next fetch starts over."""
    if page.delta or page.unchanged or page.epoch != book.epoch:
        raise ValueError(f"page from ledger {page.epoch!r} while reading {book.epoch!r}")
    for route in page.routes:
        book.routes[route.replica_id] = route
