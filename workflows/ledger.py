"""The cluster ledger: every node, every allocation, and the routing table gateways read.

Placement is an update on this one workflow, and Temporal runs a workflow's handlers one at a
time, so two replicas can never be handed the same resources. Handlers are synchronous: nothing
awaits between reading and changing the state.
"""

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from workflows.contracts import (
        Allocation,
        LedgerAck,
        LedgerState,
        NodeName,
        NodeNames,
        NodeRecord,
        NodeState,
        PlacementRefused,
        PlacementRequest,
        ReleaseRequest,
        ReplicaRef,
        ReplicaRefs,
        ReplicaState,
        Route,
        RoutingTable,
    )
    from workflows.placement import place

NO_PLACEMENT = "NoPlacement"


@workflow.defn(name="ClusterLedger")
class ClusterLedgerWorkflow:
    @workflow.init
    def __init__(self, state: LedgerState | None = None) -> None:
        self.state = state or LedgerState()

    @workflow.run
    async def run(self, state: LedgerState | None = None) -> None:
        await workflow.wait_condition(lambda: workflow.info().is_continue_as_new_suggested())
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(self.state)

    def _changed(self) -> LedgerAck:
        self.state.version += 1
        return LedgerAck(version=self.state.version)

    @workflow.update(name="upsert_node")
    def upsert_node(self, record: NodeRecord) -> LedgerAck:
        name = record.inventory.name
        if record.state == NodeState.REMOVED:
            self.state.nodes.pop(name, None)
        else:
            self.state.nodes[name] = record
        if record.state in (NodeState.LOST, NodeState.REMOVED):
            # Gateways must stop sending requests there now, not when each replica workflow
            # gets round to saying so.
            for route in self.state.routes.values():
                if route.node == name and route.state in ReplicaState.routable():
                    route.state = ReplicaState.RESTARTING
                    route.detail = f"node {name} is {record.state.value}"
        return self._changed()

    @workflow.update(name="place")
    def place(self, req: PlacementRequest) -> Allocation:
        decision = place(self.state, req)
        if isinstance(decision, PlacementRefused):
            lines = "; ".join(f"{node}: {why}" for node, why in decision.reasons.items())
            raise ApplicationError(
                f"no node can take {req.replica_id}: {lines}",
                decision,
                type=NO_PLACEMENT,
                non_retryable=True,
            )
        self.state.allocations[req.replica_id] = decision
        self._changed()
        return decision

    @workflow.update(name="release")
    def release(self, req: ReleaseRequest) -> LedgerAck:
        self.state.allocations.pop(req.replica_id, None)
        self.state.routes.pop(req.replica_id, None)
        return self._changed()

    @workflow.update(name="set_route")
    def set_route(self, route: Route) -> LedgerAck:
        if route.state == ReplicaState.STOPPED:
            self.state.routes.pop(route.replica_id, None)
        else:
            self.state.routes[route.replica_id] = route
        return self._changed()

    @workflow.query(name="routing_table")
    def routing_table(self) -> RoutingTable:
        return RoutingTable(version=self.state.version, routes=list(self.state.routes.values()))

    @workflow.query(name="replicas_on")
    def replicas_on(self, node: NodeName) -> ReplicaRefs:
        return ReplicaRefs(
            replicas=[
                ReplicaRef(replica_id=a.replica_id, workflow_id=a.workflow_id, model=a.model)
                for a in self.state.allocations.values()
                if a.node == node.name
            ]
        )

    @workflow.query(name="node_names")
    def node_names(self) -> NodeNames:
        return NodeNames(names=sorted(self.state.nodes))

    @workflow.query(name="snapshot")
    def snapshot(self) -> LedgerState:
        return self.state
