"""The ledger's route log, and what it answers a gateway asking for the routing table.

Every gateway polls the table twice a second. Sending the whole table on every change cost a
gateway 0.8 MB a change at 4,000 replicas and would pass Temporal's 4 MB query answer near
20,000. So the ledger keeps a short log of what changed gateways' routes, and answers:

- nothing (`unchanged`), when no route changed since the asker's version: a placement, a node
  registering, a release of a replica that never had a route;
- a delta: the routes changed since the asker's version and the ids removed, when the log
  reaches back that far and the delta is small (at most DELTA_MAX_ROUTES routes);
- else a page of the whole table, by replica id; the asker pages through it, holds the version
  of the first page, and asks for a delta from there (which brings anything that changed while
  it paged).

The log is part of the ledger's state and carried through continue-as-new; it holds at most
LOG_LIMIT entries (about 50 bytes each). Pure: the ledger runs it, and replays it.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Callable

from workflows.contracts import LedgerState, Route, RouteChange, RoutingTable, RoutingTableRequest

LOG_LIMIT = 2_000
# The most routes in one delta, and in one page of the whole table; a page also stops once its
# routes pass PAGE_BYTES of JSON (a route is about 220 bytes, and at most about 2 KB with a
# long detail and many adapters), far under the 2 MB payload and 4 MB answer limits.
DELTA_MAX_ROUTES = 1_000
PAGE_ROUTES = 1_000
PAGE_BYTES = 512 * 1024


def log_floor(state: LedgerState) -> int:
    """The oldest version an asker may hold and still be sent a delta."""
    return state.version if state.route_log_floor is None else state.route_log_floor


def note_change(state: LedgerState, *, replica_id: str = "", node: str = "") -> None:
    """Gateways' view changed at state.version (already bumped): this replica's route, every
    route on this node, or (neither) the idle models. The oldest entries go past LOG_LIMIT."""
    state.route_log_floor = log_floor(state)
    state.route_log.append(RouteChange(version=state.version, replica_id=replica_id, node=node))
    excess = len(state.route_log) - LOG_LIMIT
    if excess > 0:
        # An asker at the last dropped entry's version has seen it: the log still covers it.
        state.route_log_floor = state.route_log[excess - 1].version
        del state.route_log[:excess]


def forget_changes(state: LedgerState) -> None:
    """What changed up to now is not logged (a change made by a ledger from before the log):
    every asker older than this version is sent the whole table."""
    state.route_log.clear()
    state.route_log_floor = state.version


def answer(
    state: LedgerState, held: RoutingTableRequest, epoch: str, served: Callable[[Route], Route]
) -> RoutingTable:
    """What a gateway that takes deltas is sent (see the module's docstring). `served`: a
    route as gateways see it (the ledger's served_route)."""
    if held.after or held.epoch != epoch or not log_floor(state) <= held.version <= state.version:
        return page(state, held.after, epoch, served)
    start = bisect_right(state.route_log, held.version, key=lambda c: c.version)
    changes = state.route_log[start:]
    if not changes:
        return RoutingTable(version=state.version, epoch=epoch, unchanged=True)
    replicas = {c.replica_id for c in changes if c.replica_id}
    nodes = {c.node for c in changes if c.node}
    if nodes:
        replicas |= {r.replica_id for r in state.routes.values() if r.node in nodes}
    if len(replicas) > DELTA_MAX_ROUTES:
        return page(state, "", epoch, served)
    routes: list[Route] = []
    removed: list[str] = []
    for replica in sorted(replicas):
        route = state.routes.get(replica)
        if route is None:
            removed.append(replica)
        else:
            routes.append(served(route))
    idle_changed = any(not c.replica_id and not c.node for c in changes)
    if not routes and not removed and not idle_changed:
        # Only nodes without routes changed (one registering, one lost with nothing on it).
        return RoutingTable(version=state.version, epoch=epoch, unchanged=True)
    return RoutingTable(
        version=state.version,
        epoch=epoch,
        delta=True,
        since=held.version,
        routes=routes,
        removed=removed,
        idle_models=state.idle_models,
    )


def page(
    state: LedgerState, after: str, epoch: str, served: Callable[[Route], Route]
) -> RoutingTable:
    """The routes with replica ids after `after`, in id order, up to PAGE_ROUTES or PAGE_BYTES."""
    # The next page's ids without sorting the whole table for each page (40 pages at 40,000).
    rest = [i for i in state.routes if i > after] if after else list(state.routes)
    ids = heapq.nsmallest(PAGE_ROUTES, rest)
    routes: list[Route] = []
    size = 0
    for replica in ids:
        if size >= PAGE_BYTES:
            break
        route = served(state.routes[replica])
        routes.append(route)
        size += len(route.model_dump_json(exclude_defaults=True))
    return RoutingTable(
        version=state.version,
        epoch=epoch,
        routes=routes,
        idle_models=state.idle_models,
        next_after=routes[-1].replica_id if len(routes) < len(rest) else "",
    )
