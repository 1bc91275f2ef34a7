"""Routes as gateways see them: pure rules over what the fleet tables hold."""

from __future__ import annotations

from workflows.contracts import NodeState, ReplicaState, Route
from workflows.names import EXTERNAL_NODE

# The longest route detail kept: a detail is a line for an operator, not a document.
MAX_ROUTE_DETAIL = 512


def served_route(route: Route, node_state: str | None) -> Route:
    """A route as gateways see it, whatever its replica last said (a replica cannot tell that
    its node is cut off; the node's workflow can): on an unreachable node it is marked a last
    resort, on a lost, removed or unknown one it is not routable at all. `node_state`: the
    node's state in the tables, None when the node has no row."""
    if route.state not in ReplicaState.routable() or route.node == EXTERNAL_NODE:
        return route
    state = NodeState(node_state) if node_state is not None else NodeState.REMOVED
    if state in NodeState.serving():
        return route
    update: dict[str, object] = {"detail": f"node {route.node} is {state.value}"}
    if state == NodeState.UNREACHABLE:
        update["node_unreachable"] = True
    else:
        update["state"] = ReplicaState.RESTARTING
    return route.model_copy(update=update)


def stored_route(route: Route) -> Route:
    """The route as the tables keep it."""
    if len(route.detail) <= MAX_ROUTE_DETAIL:
        return route
    return route.model_copy(update={"detail": route.detail[:MAX_ROUTE_DETAIL]})
