"""An external model's routes (engine "external": servers llmgw does not run): one ready route
per URL, published to the ledger by the model workflow itself, replaced when the URLs change
and withdrawn when the model is removed.

Runs inside the model workflow (workflows/model/workflow.py), on its state; the order of what these
functions await is the order of the commands in its history.
"""

import asyncio

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.catalog import endpoint_base
    from workflows.contracts import ModelState, ReplicaState
    from workflows.ledger_activity import call_ledger
    from workflows.model.rules import external_route
    from workflows.names import ControlActivity, external_replica_id


async def publish_external(state: ModelState) -> None:
    """One ready route per URL of an external model, through the ledger update replicas
    use; a URL no longer listed (or every URL, once removed or no longer external) has its
    route withdrawn. A URL keeps its replica id while it stays listed, and every route is
    published again on each pass, so a changed definition reaches its fingerprint."""
    spec = state.spec
    published = state.external_routes
    wanted: list[str] = []
    if spec.external and not state.removing:
        wanted = [endpoint_base(url) for url in spec.profiles[0].urls]
    if not wanted and not published:
        return
    ids = {endpoint: rid for rid, endpoint in published.items()}
    routes: dict[str, str] = {}
    for endpoint in wanted:
        rid = ids.get(endpoint)
        if rid is None:
            rid = external_replica_id(spec.name, state.next_index)
            state.next_index += 1
        routes[rid] = endpoint
    fingerprint = spec.profile_fingerprint(0) if spec.external else ""
    # Add before withdrawing, so a gateway never sees the model with no route mid-change.
    await asyncio.gather(
        *(
            set_route(state, rid, endpoint, ReplicaState.READY, fingerprint)
            for rid, endpoint in routes.items()
        )
    )
    state.external_routes = routes
    await asyncio.gather(
        *(
            set_route(state, rid, endpoint, ReplicaState.STOPPED, fingerprint)
            for rid, endpoint in published.items()
            if rid not in routes
        )
    )


async def set_route(
    model: ModelState, rid: str, endpoint: str, route_state: ReplicaState, fingerprint: str
) -> None:
    route = external_route(model.spec, rid, endpoint, route_state)
    route.fingerprint = fingerprint
    await call_ledger(ControlActivity.LEDGER_SET_ROUTE, route)
