"""The control worker's ledger activities: workflows cannot send updates to other workflows,
so a replica or node workflow asks the ledger through these. Each finds the cell it concerns
(workflows/ledger_cells.py): a node's own, a route's node's, or for a placement the cell its
model's last replica went to (at first the model's home cell), else the best offer of every
cell. With one cell (every cluster until `llmgw ledger cells N`) each is one call to
`cluster`, as before cells.
"""

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel
from temporalio import activity
from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import ApplicationError

from activities.control.ledger_calls import LEDGER_CLOSED, ledger_cells, on_cell, update_ledger
from workflows.contracts import (
    Allocation,
    AllocationLookup,
    LedgerAck,
    ModelIdle,
    ModelName,
    NodeName,
    NodeNames,
    NodeRecord,
    NodeStatus,
    PlacementRefusal,
    PlacementRequest,
    ReleaseRequest,
    ReplicaAllocation,
    ReplicaRefs,
    ReplicaState,
    Route,
    RoutingTable,
)
from workflows.ledger import NO_PLACEMENT, ClusterLedgerWorkflow
from workflows.ledger_cells import (
    cell_of_node,
    cell_of_route,
    home_cell,
    merge_routes,
    offer_order,
    refusal_summary,
)
from workflows.names import ControlActivity
from workflows.placement.refusal import MAX_SUMMARY

T = TypeVar("T")


async def node_cell(client: Client, node: str) -> int:
    return cell_of_node(node, await ledger_cells(client))


async def each_cell(
    client: Client,
    cells: int,
    ask: Callable[[WorkflowHandle[ClusterLedgerWorkflow, None]], Awaitable[T]],
) -> list[T | None]:
    """One query on every cell at once, in cell order; None for a cell with no ledger yet."""
    return list(await asyncio.gather(*(on_cell(client, cell, ask) for cell in range(cells))))


async def upsert_node(client: Client, record: NodeRecord) -> LedgerAck:
    """Register or update a node in its cell."""
    cell = await node_cell(client, record.inventory.name)
    return await update_ledger(client, ClusterLedgerWorkflow.upsert_node, record, cell)


async def allocate(client: Client, req: PlacementRequest, retry: bool = False) -> Allocation:
    """Place one replica, a refusal raised as the NoPlacement error (non-retryable) with the
    reasons summarised: for the CLI, tests and the placement bench; replicas use
    place_replica(). `retry`: this replica's placement was tried before (see place_replica)."""
    decision = await place_replica(client, req, retry)
    if isinstance(decision, PlacementRefusal):
        message = f"no node can take {decision.replica_id}: {decision.summary}"
        raise ApplicationError(message, type=NO_PLACEMENT, non_retryable=True)
    return decision


@dataclass(frozen=True)
class _Hint:
    """Where a model's last replica was placed: the cell, and how many of its profiles to
    offer that cell (up to the one it took), so a hint never settles for a later profile."""

    cell: int
    profiles: int


# Per client (a control worker has one): model -> its hint. Only this process's own.
_HINTS: "weakref.WeakKeyDictionary[Client, dict[str, _Hint]]" = weakref.WeakKeyDictionary()


async def place_replica(
    client: Client, req: PlacementRequest, retry: bool = False
) -> Allocation | PlacementRefusal:
    """The ledger's placement: an allocation, or why there is none, summarised.

    With cells, one cell is asked first, with an update and no query: the cell that took this
    model's last replica (in this process), offered the profiles up to the one taken there;
    failing that the model's home cell (home_cell), offered only the first profile. A cell
    running an update refuses more than one query held for it ("consistent query buffer is
    full"), and with several placements in flight the offer queries below wait on each other;
    and the home cell spreads models, so placements in flight go to different cells' workflows
    instead of all to the lowest cell with room. Where that cell refuses, or this is a retried
    call (which may have placed already somewhere: only the offers' `held` tells), every cell
    is asked for an offer (queries: no history) and the best placed in; one that filled
    meanwhile refuses, and the next best is tried. The price: a first try does not look for
    nodes in other cells that already hold the model's weights."""
    cells = await ledger_cells(client)
    if cells == 1:
        return await update_ledger(client, ClusterLedgerWorkflow.place, req)
    hints = _HINTS.setdefault(client, {})
    hint = hints.get(req.model) or _Hint(home_cell(req.model, cells), 1)
    if not retry and hint.cell < cells:
        narrowed = req.model_copy(update={"profiles": req.profiles[: hint.profiles]})
        try:
            hinted = await update_ledger(client, ClusterLedgerWorkflow.place, narrowed, hint.cell)
        except ApplicationError as err:
            if err.type != LEDGER_CLOSED:
                raise
            hinted = None
        if isinstance(hinted, Allocation):
            hints.setdefault(req.model, hint)
            return hinted
        if hints.get(req.model) == hint:
            del hints[req.model]
    offers = await each_cell(client, cells, lambda h: h.query(ClusterLedgerWorkflow.offer, req))
    closed: ApplicationError | None = None
    for cell in offer_order(offers):
        try:
            decision = await update_ledger(client, ClusterLedgerWorkflow.place, req, cell)
        except ApplicationError as err:
            if err.type != LEDGER_CLOSED:
                raise
            # A closed cell still answers queries (from its history): the next one may place.
            closed = err
            continue
        if isinstance(decision, Allocation):
            hints[req.model] = _Hint(cell, decision.profile_index + 1)
            return decision
        # It filled since it offered: the next best.
    if closed is not None:
        raise closed  # nothing else takes it: it waits for `llmgw ledger rebuild`
    # Fits nowhere: only now each cell's reasons, which check every node.
    reasons = await each_cell(client, cells, lambda h: h.query(ClusterLedgerWorkflow.refusal, req))
    summary = refusal_summary(reasons, MAX_SUMMARY)
    return PlacementRefusal(replica_id=req.replica_id, summary=summary)


async def release(client: Client, req: ReleaseRequest) -> LedgerAck:
    """Free a replica's allocation and drop its route, in whichever cells hold them."""
    cells = await ledger_cells(client)
    if cells == 1:
        return await update_ledger(client, ClusterLedgerWorkflow.release, req)
    lookup = AllocationLookup(replica_id=req.replica_id)
    held = await each_cell(client, cells, lambda h: h.query(ClusterLedgerWorkflow.holds, lookup))
    holding = [c for c, h in enumerate(held) if h is not None and (h.allocation or h.route)]
    ack = LedgerAck(version=0)
    for cell in holding or [0]:
        ack = await update_ledger(client, ClusterLedgerWorkflow.release, req, cell)
    return ack


async def set_route(client: Client, route: Route) -> LedgerAck:
    """Publish a replica's route in its node's cell. A replica listed in cell 0 while it had
    no node leaves it once placed elsewhere: set in its new cell first, so gateways never
    lose it between the two. Only a `starting` route looks in cell 0 for one to remove: a
    replica is listed there only when a placement found no room, and every engine run after a
    placement starts with `starting` (workflows/replica.py), so the later states of a run
    cost no query on cell 0. (Until it is removed, the route in the node's cell wins over cell
    0's wherever cells are merged: merge_routes.)"""
    cells = await ledger_cells(client)
    cell = cell_of_route(route, cells)
    ack = await update_ledger(client, ClusterLedgerWorkflow.set_route, route, cell)
    if cell != 0 and route.state == ReplicaState.STARTING:
        lookup = AllocationLookup(replica_id=route.replica_id)
        held = await on_cell(client, 0, lambda h: h.query(ClusterLedgerWorkflow.holds, lookup))
        if held is not None and held.route:
            gone = route.model_copy(update={"node": "", "state": ReplicaState.STOPPED})
            await update_ledger(client, ClusterLedgerWorkflow.set_route, gone)
    return ack


async def _answers(
    client: Client, ask: Callable[[WorkflowHandle[ClusterLedgerWorkflow, None]], Awaitable[T]]
) -> list[T]:
    """One query's answers from every cell that has a ledger, cell 0 first."""
    answers = await each_cell(client, await ledger_cells(client), ask)
    return [a for a in answers if a is not None]


class LedgerActivities:
    def __init__(self, client: Client) -> None:
        self.client = client

    def all(self) -> list[Callable[..., Awaitable[BaseModel]]]:
        return [
            self.upsert_node,
            self.place,
            self.release,
            self.set_route,
            self.replicas_on_node,
            self.node_names,
            self.model_routes,
            self.set_idle,
            self.node_state,
            self.allocation,
        ]

    @activity.defn(name=ControlActivity.LEDGER_UPSERT_NODE)
    async def upsert_node(self, record: NodeRecord) -> LedgerAck:
        return await upsert_node(self.client, record)

    @activity.defn(name=ControlActivity.LEDGER_PLACE)
    async def place(self, req: PlacementRequest) -> Allocation | PlacementRefusal:
        return await place_replica(self.client, req, retry=activity.info().attempt > 1)

    @activity.defn(name=ControlActivity.LEDGER_RELEASE)
    async def release(self, req: ReleaseRequest) -> LedgerAck:
        return await release(self.client, req)

    @activity.defn(name=ControlActivity.LEDGER_SET_ROUTE)
    async def set_route(self, route: Route) -> LedgerAck:
        return await set_route(self.client, route)

    @activity.defn(name=ControlActivity.LEDGER_REPLICAS_ON_NODE)
    async def replicas_on_node(self, node: NodeName) -> ReplicaRefs:
        cell = await node_cell(self.client, node.name)
        refs = await on_cell(
            self.client, cell, lambda h: h.query(ClusterLedgerWorkflow.replicas_on, node)
        )
        return refs or ReplicaRefs()

    @activity.defn(name=ControlActivity.LEDGER_NODE_NAMES)
    async def node_names(self) -> NodeNames:
        answers = await _answers(self.client, lambda h: h.query(ClusterLedgerWorkflow.node_names))
        return NodeNames(names=sorted(name for a in answers for name in a.names))

    @activity.defn(name=ControlActivity.LEDGER_MODEL_ROUTES)
    async def model_routes(self, model: ModelName) -> RoutingTable:
        tables = await _answers(
            self.client, lambda h: h.query(ClusterLedgerWorkflow.model_routes, model)
        )
        if len(tables) == 1:
            return tables[0]
        routes = merge_routes(t.routes for t in tables)
        return RoutingTable(version=sum(t.version for t in tables), routes=list(routes.values()))

    @activity.defn(name=ControlActivity.LEDGER_SET_IDLE)
    async def set_idle(self, idle: ModelIdle) -> LedgerAck:
        # The idle models live in cell 0, which every gateway reads first.
        return await update_ledger(self.client, ClusterLedgerWorkflow.set_idle, idle)

    @activity.defn(name=ControlActivity.LEDGER_ALLOCATION)
    async def allocation(self, req: AllocationLookup) -> ReplicaAllocation:
        answers = await _answers(
            self.client, lambda h: h.query(ClusterLedgerWorkflow.allocation, req)
        )
        held = [a for a in answers if a.allocation is not None]
        return held[0] if held else ReplicaAllocation()

    @activity.defn(name=ControlActivity.LEDGER_NODE_STATE)
    async def node_state(self, node: NodeName) -> NodeStatus:
        cell = await node_cell(self.client, node.name)
        status = await on_cell(
            self.client, cell, lambda h: h.query(ClusterLedgerWorkflow.node_state, node)
        )
        return status or NodeStatus(name=node.name)
