"""The control worker's activities on the fleet tables: workflows cannot open a database, so a
replica or node workflow places, releases, routes and reads through these. Each is one
transaction (store/fleet/tables.py), idempotent by replica id or node name, and quick: retried
briskly (workflows/options.py LEDGER_*)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pydantic import BaseModel
from temporalio import activity

from activities.control.placer import Placer
from store.fleet import FleetTables
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
    Route,
    RoutingTable,
)
from workflows.names import ControlActivity
from workflows.placement.compact import compact_record


class FleetActivities:
    def __init__(self, tables: FleetTables, placer: Placer | None = None) -> None:
        self.tables = tables
        self.placer = placer or Placer(tables)

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
        # Only what placement and `llmgw nodes` read: the node workflow keeps the rest.
        if await self.tables.upsert_node(compact_record(record)):
            self.placer.node_written(record.inventory.name)
        return LedgerAck(version=0)

    @activity.defn(name=ControlActivity.LEDGER_PLACE)
    async def place(self, req: PlacementRequest) -> Allocation | PlacementRefusal:
        return await self.placer.place(req)

    @activity.defn(name=ControlActivity.LEDGER_RELEASE)
    async def release(self, req: ReleaseRequest) -> LedgerAck:
        await self.tables.release(req.replica_id)
        await self.placer.released(req.replica_id)
        return LedgerAck(version=0)

    @activity.defn(name=ControlActivity.LEDGER_SET_ROUTE)
    async def set_route(self, route: Route) -> LedgerAck:
        await self.tables.set_route(route)
        return LedgerAck(version=0)

    @activity.defn(name=ControlActivity.LEDGER_REPLICAS_ON_NODE)
    async def replicas_on_node(self, node: NodeName) -> ReplicaRefs:
        return ReplicaRefs(replicas=await self.tables.replicas_on(node.name))

    @activity.defn(name=ControlActivity.LEDGER_NODE_NAMES)
    async def node_names(self) -> NodeNames:
        return NodeNames(names=await self.tables.node_names())

    @activity.defn(name=ControlActivity.LEDGER_MODEL_ROUTES)
    async def model_routes(self, model: ModelName) -> RoutingTable:
        """The model's routes as its workflow reads them (which replicas, where, in which state,
        with which profile), nothing else: the answer is in the model's history. About 220
        bytes a route: 5,000 replicas in 1.1 MB, under Temporal's 2 MB payload limit."""
        routes = await self.tables.model_routes(model.name)
        return RoutingTable(routes=[slim_route(r) for r in routes])

    @activity.defn(name=ControlActivity.LEDGER_SET_IDLE)
    async def set_idle(self, idle: ModelIdle) -> LedgerAck:
        await self.tables.set_idle(idle.model, idle.idle)
        return LedgerAck(version=0)

    @activity.defn(name=ControlActivity.LEDGER_ALLOCATION)
    async def allocation(self, req: AllocationLookup) -> ReplicaAllocation:
        return ReplicaAllocation(allocation=await self.tables.allocation(req.replica_id))

    @activity.defn(name=ControlActivity.LEDGER_NODE_STATE)
    async def node_state(self, node: NodeName) -> NodeStatus:
        return NodeStatus(name=node.name, state=await self.tables.node_state(node.name))


def slim_route(route: Route) -> Route:
    return Route(
        replica_id=route.replica_id,
        model=route.model,
        node=route.node,
        endpoint="",
        engine=route.engine,
        state=route.state,
        fingerprint=route.fingerprint,
    )
