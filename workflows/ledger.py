"""The cluster ledger: every node, every allocation, and the routing table gateways read; or,
in a cluster split into cells (workflows/ledger_cells.py), one cell's share of them.

Placement is an update on the workflow that holds the nodes, and Temporal runs a workflow's
handlers one at a time, so two replicas can never be handed the same resources. Handlers are
synchronous: nothing awaits between reading and changing the state.
"""

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from workflows import history_budget
    from workflows.contracts import (
        Allocation,
        AllocationLookup,
        LedgerAck,
        LedgerCells,
        LedgerState,
        ModelIdle,
        ModelName,
        NodeName,
        NodeNames,
        NodeRecord,
        NodeState,
        NodeStatus,
        PlacementOffer,
        PlacementRefusal,
        PlacementRefused,
        PlacementRequest,
        ReleaseRequest,
        ReplicaAllocation,
        ReplicaHeld,
        ReplicaRef,
        ReplicaRefs,
        ReplicaState,
        Route,
        RoutingTable,
        RoutingTableRequest,
    )
    from workflows.ledger_cells import MAX_CELLS
    from workflows.ledger_compact import (
        PackedLedgerState,
        carried_state,
        compact_record,
        pack_state,
    )
    from workflows.names import EXTERNAL_NODE
    from workflows.placement import PlacementIndex, first_fit, place
    from workflows.placement.disk import must_fetch
    from workflows.placement.refusal import summarise_refusal
    from workflows.route_log import answer, forget_changes, note_change

NO_PLACEMENT = "NoPlacement"
CELLS_FIXED = "LedgerCellsFixed"
# Where a run's packed state earns a warning: half of Temporal's 2 MB payload limit, reached
# at about 1,200 eight-GPU nodes with four replicas each (docs/benchmarks.md).
STATE_WARNING_BYTES = 1024 * 1024
# `place` answers a refusal as its result, summarised, rather than failing with every node's
# reason (88 KB at 1,000 nodes, in history each time a waiting replica asks).
PLACE_RETURNS_REFUSAL = "ledger-place-returns-refusal"
# A node that must fetch a model's weights is refused when it lacks the disk for them
# (workflows/placement/disk.py). Requests that name the size come only from replicas since;
# before the marker a size is set aside, so a history in which an older ledger placed such a
# request (a rolling upgrade of the control workers) replays as it ran.
PLACE_CHECKS_DISK = "ledger-place-checks-disk"
# The ledger logs what changes gateways' routes, and sends a gateway that takes deltas only
# what changed since its version (workflows/route_log.py). Before the marker nothing was
# logged: a history from then replays forgetting the log at each change, so no delta is ever
# made from a log with holes in it.
ROUTE_DELTAS = "ledger-route-deltas"
# The longest route detail the ledger keeps (see set_route).
MAX_ROUTE_DETAIL = 512


# Outside the SDK's workflow sandbox: the ledger is the busiest workflow of a cluster (every
# placement and route is an update to it), and running it sandboxed cost a fifth of its
# throughput and of its median latency (`make bench-ledger-sandbox`, side by side; figures in
# docs/benchmarks.md). What the sandbox would catch is kept out by hand, and checked by
# tests/unit/test_ledger_unsandboxed.py: this module and what it imports run only pure,
# deterministic code (no clock but workflow.now(), no randomness, no I/O, no state at module
# level).
@workflow.defn(name="ClusterLedger", sandboxed=False)
class ClusterLedgerWorkflow:
    # A run starts from nothing, from a plain LedgerState (a new cluster, or a run started
    # before packing) or from the packed state its previous run carried (workflows/
    # ledger_compact.py): the whole state as plain JSON outgrows Temporal's 2 MB payload limit
    # at about 1,000 nodes.
    @workflow.init
    def __init__(self, state: LedgerState | PackedLedgerState | None = None) -> None:
        self.state = carried_state(state)
        # Built once a run from the allocations, then kept: never carried, never in history.
        # Built on first use, not here: a new run's first activation already unpacks the whole
        # state, and Temporal fails an activation that runs over 2 s.
        self._index: PlacementIndex | None = None
        # The same for the `offer` and `refusal` queries, kept apart: a query must not change
        # what a handler computes. A replay (a worker that evicted this run) runs no queries,
        # so its handlers build their index where the first run's did.
        self._query_index: PlacementIndex | None = None

    @workflow.run
    async def run(self, state: LedgerState | PackedLedgerState | None = None) -> None:  # noqa: ARG002 - read by __init__ (@workflow.init), before any handler
        await workflow.wait_condition(lambda: history_budget.time_to_continue(forced=False))
        await workflow.wait_condition(workflow.all_handlers_finished)
        packed = pack_state(self.state)
        if len(packed.packed) > STATE_WARNING_BYTES:
            workflow.logger.warning(
                "ledger cell %d carries %d KB into its next run, and Temporal refuses a payload "
                "over 2 MB: a fleet this size wants more cells (docs/operations.md)",
                self.state.cell,
                len(packed.packed) // 1024,
            )
        workflow.continue_as_new(packed)

    @property
    def index(self) -> PlacementIndex:
        if self._index is None:
            self._index = PlacementIndex(self.state)
        return self._index

    @property
    def query_index(self) -> PlacementIndex:
        if self._query_index is None:
            self._query_index = PlacementIndex(self.state)
        return self._query_index

    def _indexes(self) -> list[PlacementIndex]:
        """The indexes built so far, which every change to nodes or allocations updates."""
        return [i for i in (self._index, self._query_index) if i is not None]

    def _changed(self) -> LedgerAck:
        self.state.version += 1
        return LedgerAck(version=self.state.version)

    def _routes_changed(self, replica_id: str = "", node: str = "") -> None:
        """What gateways see changed at this version (called after _changed)."""
        if workflow.patched(ROUTE_DELTAS):
            note_change(self.state, replica_id=replica_id, node=node)
        else:
            forget_changes(self.state)

    @workflow.update(name="upsert_node")
    def upsert_node(self, record: NodeRecord) -> LedgerAck:
        name = record.inventory.name
        before = self.state.nodes.get(name)
        if record.state == NodeState.REMOVED:
            self.state.nodes.pop(name, None)
        else:
            # Only what placement and `llmgw nodes` read: the node workflow keeps the rest.
            self.state.nodes[name] = compact_record(record)
        for index in self._indexes():  # one not built yet is built from this state
            index.node_changed(name)
        ack = self._changed()
        # Routes on a node that stops serving are withdrawn in what gateways read (served_route)
        # rather than rewritten here: when an unreachable node is heard again, its replicas'
        # routes are ready again with nothing restarted. served_route reads only the node's
        # state, so only a change of state changes what gateways see.
        after = self.state.nodes.get(name)
        if (before.state if before else None) != (after.state if after else None):
            self._routes_changed(node=name)
        return ack

    def served_route(self, route: Route) -> Route:
        """A route as gateways see it, whatever its replica last said (a replica cannot tell
        that its node is cut off; the node workflow can): on an unreachable node it is marked
        a last resort, on a lost or removed one it is not routable at all."""
        if route.state not in ReplicaState.routable() or route.node == EXTERNAL_NODE:
            return route
        node = self.state.nodes.get(route.node)
        if node is not None and node.state in NodeState.serving():
            return route
        state = node.state if node is not None else NodeState.REMOVED
        update: dict[str, object] = {"detail": f"node {route.node} is {state.value}"}
        if state == NodeState.UNREACHABLE:
            update["node_unreachable"] = True
        else:
            update["state"] = ReplicaState.RESTARTING
        return route.model_copy(update=update)

    @workflow.update(name="place")
    def place(self, req: PlacementRequest) -> Allocation | PlacementRefusal:
        if req.artifact_size and not workflow.patched(PLACE_CHECKS_DISK):
            req = req.model_copy(update={"artifact_size": 0})
        decision = place(self.state, req, self.index)
        if isinstance(decision, PlacementRefused) and workflow.patched(PLACE_RETURNS_REFUSAL):
            summary = summarise_refusal(decision.reasons)
            return PlacementRefusal(replica_id=req.replica_id, summary=summary)
        if isinstance(decision, PlacementRefused):
            lines = "; ".join(f"{node}: {why}" for node, why in decision.reasons.items())
            raise ApplicationError(
                f"no node can take {req.replica_id}: {lines}",
                decision,
                type=NO_PLACEMENT,
                non_retryable=True,
            )
        if req.replica_id not in self.state.allocations:  # else a retry: already counted
            self.state.allocations[req.replica_id] = decision
            self.index.add(decision)
            if self._query_index is not None:
                self._query_index.add(decision)
        self._changed()
        return decision

    @workflow.update(name="release")
    def release(self, req: ReleaseRequest) -> LedgerAck:
        alloc = self.state.allocations.pop(req.replica_id, None)
        if alloc is not None:
            self.index.remove(alloc)
            if self._query_index is not None:
                self._query_index.remove(alloc)
        route = self.state.routes.pop(req.replica_id, None)
        ack = self._changed()
        if route is not None:
            self._routes_changed(replica_id=req.replica_id)
        return ack

    @workflow.update(name="set_route")
    def set_route(self, route: Route) -> LedgerAck:
        # Gateways read routes a page of a thousand at a time: a detail is a line for an
        # operator, not a document.
        route.detail = route.detail[:MAX_ROUTE_DETAIL]
        before = self.state.routes.get(route.replica_id)
        if route.state == ReplicaState.STOPPED:
            self.state.routes.pop(route.replica_id, None)
            after = None
        else:
            self.state.routes[route.replica_id] = after = route
        ack = self._changed()
        if before != after:  # a replica saying again what it said sends gateways nothing
            self._routes_changed(replica_id=route.replica_id)
        return ack

    @workflow.query(name="routing_table")
    def routing_table(self, held: RoutingTableRequest | None = None) -> RoutingTable:
        epoch = workflow.info().first_execution_run_id
        if held is not None and held.deltas:
            table = answer(self.state, held, epoch, self.served_route)
            table.cells = self.state.cells
            return table
        # A gateway from before deltas: the whole table in one answer, as it expects.
        version = self.state.version
        if held is not None and (held.epoch, held.version) == (epoch, version):
            return RoutingTable(
                version=version, epoch=epoch, unchanged=True, cells=self.state.cells
            )
        return RoutingTable(
            version=version,
            epoch=epoch,
            routes=[self.served_route(r) for r in self.state.routes.values()],
            idle_models=self.state.idle_models,
            cells=self.state.cells,
        )

    @workflow.update(name="set_idle")
    def set_idle(self, idle: ModelIdle) -> LedgerAck:
        models = set(self.state.idle_models)
        models = models | {idle.model} if idle.idle else models - {idle.model}
        before, self.state.idle_models = self.state.idle_models, sorted(models)
        ack = self._changed()
        if before != self.state.idle_models:
            self._routes_changed()
        return ack

    @workflow.query(name="offer")
    def offer(self, req: PlacementRequest) -> PlacementOffer:
        """Whether this cell could place the replica now, placing nothing (workflows/
        ledger_cells.py): a query, so asking every cell writes no history. No reasons: those
        check every node, and `refusal` gives them when no cell fits."""
        alloc = first_fit(self.state, req, self.query_index)
        if alloc is None:
            return PlacementOffer(replica_id=req.replica_id, fits=False)
        node = self.state.nodes.get(alloc.node)
        fetches = bool(req.artifact) and (node is None or must_fetch(node, req.artifact))
        return PlacementOffer(
            replica_id=req.replica_id,
            fits=True,
            held=req.replica_id in self.state.allocations,
            profile_index=alloc.profile_index,
            fetches=fetches,
        )

    @workflow.query(name="refusal")
    def refusal(self, req: PlacementRequest) -> PlacementOffer:
        """Why this cell cannot place the replica, summarised; fits when it can after all."""
        decision = place(self.state, req, self.query_index)
        if isinstance(decision, PlacementRefused):
            summary = summarise_refusal(decision.reasons)
            return PlacementOffer(replica_id=req.replica_id, fits=False, summary=summary)
        return PlacementOffer(replica_id=req.replica_id, fits=True)

    @workflow.query(name="holds")
    def holds(self, req: AllocationLookup) -> ReplicaHeld:
        return ReplicaHeld(
            allocation=req.replica_id in self.state.allocations,
            route=req.replica_id in self.state.routes,
        )

    @workflow.query(name="cells")
    def cells(self) -> LedgerCells:
        fixed = self.state.cells > 1 or bool(self.state.nodes)
        return LedgerCells(cells=self.state.cells, fixed=fixed)

    @workflow.update(name="set_cells")
    def set_cells(self, cells: LedgerCells) -> LedgerAck:
        """Split the ledger into cells (`llmgw ledger cells N`): once, before any node
        registers, since a node's cell follows from the count (workflows/ledger_cells.py)."""
        if cells.cells != self.state.cells:
            if self.state.cell != 0 or self.state.cells > 1 or self.state.nodes:
                raise ApplicationError(
                    f"the ledger has {self.state.cells} cell(s) and nodes have registered or "
                    "it was split already: the cell count is set once, before nodes join",
                    type=CELLS_FIXED,
                    non_retryable=True,
                )
            if cells.cells > MAX_CELLS:
                raise ApplicationError(
                    f"{cells.cells} cells: at most {MAX_CELLS}",
                    type=CELLS_FIXED,
                    non_retryable=True,
                )
            # Every answer to a gateway carries the count: nothing to log for them.
            self.state.cells = cells.cells
        return self._changed()

    @workflow.query(name="model_routes")
    def model_routes(self, model: ModelName) -> RoutingTable:
        routes = [self.served_route(r) for r in self.state.routes.values() if r.model == model.name]
        return RoutingTable(version=self.state.version, routes=routes)

    @workflow.query(name="allocation")
    def allocation(self, req: AllocationLookup) -> ReplicaAllocation:
        return ReplicaAllocation(allocation=self.state.allocations.get(req.replica_id))

    @workflow.query(name="node_state")
    def node_state(self, node: NodeName) -> NodeStatus:
        record = self.state.nodes.get(node.name)
        return NodeStatus(name=node.name, state=record.state if record is not None else None)

    @workflow.query(name="replicas_on")
    def replicas_on(self, node: NodeName) -> ReplicaRefs:
        return ReplicaRefs(
            replicas=[
                ReplicaRef(replica_id=a.replica_id, workflow_id=a.workflow_id, model=a.model)
                for a in self.state.allocations.values()
                # A multi-node replica is on every node one of its shards is on.
                if any(s.node == node.name for s in a.shards_or_leader())
            ]
        )

    @workflow.query(name="node_names")
    def node_names(self) -> NodeNames:
        return NodeNames(names=sorted(self.state.nodes))

    @workflow.query(name="snapshot")
    def snapshot(self) -> LedgerState:
        return self.state

    @workflow.query(name="packed_snapshot")
    def packed_snapshot(self) -> PackedLedgerState:
        """The snapshot compressed: a query answer is one gRPC message, at most 4 MB, and the
        plain snapshot of 1,000 eight-GPU nodes with 4,000 replicas is about 8 MB."""
        return pack_state(self.state)
