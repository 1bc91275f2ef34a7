"""`llmgw ledger check` and `llmgw ledger rebuild`: the fleet tables against the workflows.

The workflows are the truth for what should run where: each node workflow holds its record,
each running replica workflow its allocation and route, each model workflow whether it is
scaled to zero and its external routes. The tables are what placement and gateways read, and
each of those workflows writes its part in the step that changes it. `check` rebuilds the
tables' contents from the workflows and shows where they differ (zero is the goal); `rebuild`
writes what the workflows hold into the tables (after a restore of the database from an older
backup, say).
"""

import argparse

from temporalio.client import Client, WorkflowHandle

from store.fleet import FleetTables
from workers.connect import connect_with_retry
from workers.paths import Locations
from workers.progress import fleet_tables
from workflows.addresses import http_base
from workflows.contracts import (
    Allocation,
    LedgerState,
    ModelView,
    NodeState,
    NodeView,
    ReplicaState,
    ReplicaView,
    Route,
)
from workflows.model.client import list_models
from workflows.model.rules import external_route
from workflows.node.workflow import NodeWorkflow
from workflows.placement.compact import compact_record
from workflows.replica.workflow import ReplicaWorkflow

RUNNING_NODES = "WorkflowType = 'Node' AND ExecutionStatus = 'Running'"
RUNNING_REPLICAS = "WorkflowType = 'Replica' AND ExecutionStatus = 'Running'"


async def _running_ids(client: Client, query: str) -> list[str]:
    return sorted({execution.id async for execution in client.list_workflows(query)})


async def _nodes(client: Client, state: LedgerState) -> None:
    for workflow_id in await _running_ids(client, RUNNING_NODES):
        handle: WorkflowHandle[NodeWorkflow, NodeView | None] = client.get_workflow_handle(
            workflow_id
        )
        view = await handle.query(NodeWorkflow.describe)
        if view is None or view.record.state == NodeState.REMOVED:
            continue  # not registered yet, or on its way out: not placeable either way
        state.nodes[view.record.inventory.name] = compact_record(view.record)


def _replica_route(view: ReplicaView, alloc: Allocation | None, model: ModelView | None) -> Route:
    """The route the replica last published, as far as its workflow and model tell it."""
    index = alloc.profile_index if alloc is not None else 0
    engine, fingerprint = "", ""
    if model is not None and index < len(model.spec.profiles):
        engine = model.spec.profiles[index].engine
        # A replica its model calls stale runs an older profile, whose fingerprint is gone.
        if view.replica_id not in model.stale:
            fingerprint = model.spec.profile_fingerprint(index)
    return Route(
        replica_id=view.replica_id,
        model=view.model,
        node=alloc.node if alloc is not None else "",
        endpoint=http_base(alloc.address, alloc.port) if alloc is not None else "",
        engine=engine,
        state=view.state,
        fingerprint=fingerprint,
        detail=view.detail,
    )


async def _replicas(client: Client, state: LedgerState, models: dict[str, ModelView]) -> None:
    for workflow_id in await _running_ids(client, RUNNING_REPLICAS):
        handle: WorkflowHandle[ReplicaWorkflow, ReplicaView] = client.get_workflow_handle(
            workflow_id
        )
        view = await handle.query(ReplicaWorkflow.describe)
        if view.state == ReplicaState.STOPPED:
            continue  # released, or releasing
        alloc = await handle.query(ReplicaWorkflow.allocation)
        if alloc is not None:
            state.allocations[alloc.replica_id] = alloc
        state.routes[view.replica_id] = _replica_route(view, alloc, models.get(view.model))


def _models(state: LedgerState, models: dict[str, ModelView]) -> None:
    for view in models.values():
        spec = view.spec
        if spec.autoscale is not None and spec.replicas == 0 and not view.removing:
            state.idle_models.append(spec.name)
        for rid, endpoint in view.external_routes.items():
            state.routes[rid] = external_route(spec, rid, endpoint, ReplicaState.READY)
    state.idle_models.sort()


async def rebuilt_state(client: Client) -> LedgerState:
    """What the fleet tables should hold, from the workflows that own each part of it."""
    state = LedgerState()
    models = {view.spec.name: view for view in await list_models(client)}
    await _nodes(client, state)
    await _replicas(client, state, models)
    _models(state, models)
    return state


def drift(want: LedgerState, have: LedgerState) -> list[str]:
    """Where the tables (`have`) differ from the workflows (`want`), a line each. Routes are
    compared by what gateways act on (state, endpoint, node); a detail may differ."""
    lines: list[str] = []
    for name in sorted(want.nodes.keys() - have.nodes.keys()):
        lines.append(f"node {name}: its workflow runs, the tables do not list it")
    for name in sorted(have.nodes.keys() - want.nodes.keys()):
        lines.append(f"node {name}: in the tables, no running workflow")
    for name in sorted(want.nodes.keys() & have.nodes.keys()):
        if want.nodes[name].state != have.nodes[name].state:
            lines.append(
                f"node {name}: {want.nodes[name].state.value} in its workflow, "
                f"{have.nodes[name].state.value} in the tables"
            )
    for rid in sorted(want.allocations.keys() | have.allocations.keys()):
        wanted, held = want.allocations.get(rid), have.allocations.get(rid)
        if wanted is None:
            lines.append(f"allocation {rid}: held in the tables, no running replica holds it")
        elif held is None:
            lines.append(f"allocation {rid}: its replica holds it, the tables do not")
        elif wanted != held:
            lines.append(f"allocation {rid}: differs between its replica and the tables")
    for rid in sorted(want.routes.keys() | have.routes.keys()):
        a, b = want.routes.get(rid), have.routes.get(rid)
        if a is None or b is None:
            where = "the tables only" if a is None else "its workflow only"
            lines.append(f"route {rid}: in {where}")
        elif (a.state, a.endpoint, a.node) != (b.state, b.endpoint, b.node):
            lines.append(
                f"route {rid}: {a.state.value} at {a.endpoint or '-'} in its workflow, "
                f"{b.state.value} at {b.endpoint or '-'} in the tables"
            )
    if want.idle_models != have.idle_models:
        lines.append(f"idle models: {want.idle_models} in the workflows, {have.idle_models} held")
    return lines


async def rebuild(client: Client, fleet: FleetTables) -> LedgerState:
    """Write what the workflows hold into the tables: nodes, allocations, routes, idle models."""
    state = await rebuilt_state(client)
    for record in state.nodes.values():
        await fleet.upsert_node(record)
    await fleet.replace_all(state)
    held = await fleet.snapshot()
    for model in set(held.idle_models) | set(state.idle_models):
        await fleet.set_idle(model, model in state.idle_models)
    return state


def add_ledger_parsers(
    sub: "argparse._SubParsersAction[argparse.ArgumentParser]", common: argparse.ArgumentParser
) -> None:
    ledger = sub.add_parser(
        "ledger", parents=[common], help="the fleet tables (allocations, routes) in the store"
    )
    commands = ledger.add_subparsers(dest="ledger_command", required=True)
    commands.add_parser(
        "check",
        parents=[common],
        help="compare the fleet tables with the workflows; exit 1 on any difference",
    )
    commands.add_parser(
        "rebuild", parents=[common], help="write what the workflows hold into the fleet tables"
    )


async def ledger_command(args: argparse.Namespace, client: Client, fleet: FleetTables) -> None:
    if args.ledger_command == "check":
        lines = drift(await rebuilt_state(client), await fleet.snapshot())
        for line in lines:
            print(line)
        if lines:
            raise SystemExit(1)
        print("the fleet tables agree with the workflows")
    elif args.ledger_command == "rebuild":
        state = await rebuild(client, fleet)
        print(
            f"wrote the fleet tables from the workflows: {len(state.nodes)} nodes, "
            f"{len(state.allocations)} allocations, {len(state.routes)} routes"
        )


async def run_ledger_command(args: argparse.Namespace, where: Locations) -> None:
    try:
        client = await connect_with_retry(where, attempts=3)
    except RuntimeError as err:
        raise SystemExit(f"cannot reach Temporal at {where.temporal}: {err}") from None
    fleet = await fleet_tables(where)
    try:
        await ledger_command(args, client, fleet)
    finally:
        await fleet.close()
