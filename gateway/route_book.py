"""The gateway's copy of the routing table, kept up to date from the fleet tables' answers.

The tables (store/fleet/tables.py: routing_table) answer a gateway with nothing new, the routes
changed since the gateway's version, or the whole table. This is the pure part of applying
those: which answer follows the copy and which means reading the whole table again.
StoreRouteSource (route_source.py) does the asking.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workflows.contracts import Route, RoutingTable, RoutingTableRequest


@dataclass
class RouteBook:
    """One store's table (epoch) as of one version, by replica id."""

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
    other (another store, a version the book does not hold) means fetching the whole table:
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
    """A book from a whole table."""
    if first.delta or first.unchanged:
        raise ValueError("a whole table was wanted, not a delta")
    routes = {r.replica_id: r for r in first.routes}
    return RouteBook(first.epoch, first.version, routes, list(first.idle_models))
