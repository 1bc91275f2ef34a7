"""`llmgw ledger rebuild`: a new cluster ledger from what the node and replica workflows hold.

The ledger (`cluster`) is the one record of which node holds which GPU, core and port, and
of the routes gateways read. Ledger calls never start it over a closed run (an operator's
terminate): an empty ledger would hand every device out again. While it is closed, placements,
releases and route changes wait (their activities retry, saying why), and this command rebuilds
it: every node from its Node workflow, every allocation and route from its running Replica
workflow, idle models and external routes from the Model workflows. The calls that waited then
go through on the rebuilt ledger.
"""

import argparse
import asyncio

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError

from activities.control.ledger_calls import (
    ledger_cells,
    ledger_handle,
    ledger_status,
    update_ledger,
)
from workers.connect import connect_with_retry
from workers.paths import Locations
from workflows.addresses import http_base
from workflows.contracts import (
    Allocation,
    LedgerCells,
    LedgerState,
    ModelView,
    NodeState,
    NodeView,
    ReplicaState,
    ReplicaView,
    Route,
)
from workflows.ledger import ClusterLedgerWorkflow
from workflows.ledger_cells import merge_states, split_state
from workflows.ledger_compact import compact_record, pack_state
from workflows.model import external_route
from workflows.model_client import list_models
from workflows.names import CONTROL_TASK_QUEUE, LEDGER_WORKFLOW_ID, ledger_cell_workflow_id
from workflows.node import NodeWorkflow
from workflows.replica import ReplicaWorkflow

RUNNING_NODES = "WorkflowType = 'Node' AND ExecutionStatus = 'Running'"
RUNNING_REPLICAS = "WorkflowType = 'Replica' AND ExecutionStatus = 'Running'"


class LedgerRunning(Exception):
    """The ledger runs: there is nothing to rebuild, and rebuilding would drop its state."""


async def ledger_problem(client: Client) -> str | None:
    """A line for `llmgw status` when the ledger, or a cell of it, is closed; None when every
    cell that started runs."""
    status = await ledger_status(client)
    if status != WorkflowExecutionStatus.RUNNING:
        what = "does not exist" if status is None else f"is {status.name.lower()}"
        return f"the cluster ledger workflow {what}; run `llmgw ledger rebuild`"
    closed = [
        ledger_cell_workflow_id(cell)
        for cell, status in enumerate(await _cell_statuses(client, await ledger_cells(client)))
        if status not in (None, WorkflowExecutionStatus.RUNNING)
    ]
    if not closed:
        return None
    return f"ledger cell workflow(s) {', '.join(closed)} closed; run `llmgw ledger rebuild`"


async def _cell_statuses(client: Client, cells: int) -> list[WorkflowExecutionStatus | None]:
    return list(await asyncio.gather(*(ledger_status(client, c) for c in range(cells))))


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
            continue  # released, or releasing (that call waits for the rebuilt ledger)
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
    """The ledger's state from the workflows that own each part of it."""
    state = LedgerState()
    models = {view.spec.name: view for view in await list_models(client)}
    await _nodes(client, state)
    await _replicas(client, state, models)
    _models(state, models)
    return state


async def rebuild_ledger(client: Client, cells: int | None = None) -> LedgerState:
    """Start a new run of every closed ledger cell from the rebuilt state; refused while they
    all run. `cells`: how many the ledger has; read from cell 0 (a closed workflow still
    answers queries while its history is kept) when not given."""
    cells = cells or await ledger_cells(client)
    statuses = await _cell_statuses(client, cells)
    running = WorkflowExecutionStatus.RUNNING
    if statuses[0] == running and all(s in (None, running) for s in statuses):
        raise LedgerRunning(f"the cluster ledger ({LEDGER_WORKFLOW_ID!r}) is running")
    parts = split_state(await rebuilt_state(client), cells)
    # A cell that never started has no ledger to lose (no node of it registered): the first
    # call for one of its nodes starts it.
    closed = [
        cell
        for cell, status in enumerate(statuses)
        if status != running
        and (status is not None or cell == 0 or parts[cell].nodes or parts[cell].routes)
    ]
    for cell in closed:
        # The one place a ledger run may start where one existed; FAIL keeps it from ever
        # replacing a running one (someone else rebuilt first).
        await client.start_workflow(
            ClusterLedgerWorkflow.run,
            pack_state(parts[cell]),
            id=ledger_cell_workflow_id(cell),
            task_queue=CONTROL_TASK_QUEUE,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
        )
    return merge_states(parts)


async def set_ledger_cells(client: Client, cells: int) -> LedgerCells:
    """`llmgw ledger cells N`: split a new cluster's ledger into N cells (before nodes join)."""
    await update_ledger(client, ClusterLedgerWorkflow.set_cells, LedgerCells(cells=cells))
    return await ledger_handle(client).query(ClusterLedgerWorkflow.cells)


def add_ledger_parsers(
    sub: "argparse._SubParsersAction[argparse.ArgumentParser]", common: argparse.ArgumentParser
) -> None:
    ledger = sub.add_parser("ledger", parents=[common], help="the cluster ledger")
    commands = ledger.add_subparsers(dest="ledger_command", required=True)
    rebuild = commands.add_parser(
        "rebuild",
        parents=[common],
        help="start a closed ledger again from the node and replica workflows",
    )
    rebuild.add_argument(
        "--cells",
        type=int,
        help="how many cells the ledger has, where its `cluster` workflow's history is gone",
    )
    split = commands.add_parser(
        "cells",
        parents=[common],
        help=(
            "split the ledger into N cells, one per 500 nodes; once, before any "
            "node joins (docs/operations.md)"
        ),
    )
    split.add_argument("count", type=int)


async def ledger_command(args: argparse.Namespace, client: Client) -> None:
    if args.ledger_command == "cells":
        try:
            answer = await set_ledger_cells(client, args.count)
        except ApplicationError as err:
            raise SystemExit(str(err)) from None
        print(f"the cluster ledger has {answer.cells} cell(s)")
    elif args.ledger_command == "rebuild":
        try:
            state = await rebuild_ledger(client, args.cells)
        except LedgerRunning as err:
            raise SystemExit(f"{err}: nothing to rebuild") from None
        print(
            f"rebuilt the cluster ledger: {len(state.nodes)} nodes, "
            f"{len(state.allocations)} allocations, {len(state.routes)} routes"
        )


async def run_ledger_command(args: argparse.Namespace, where: Locations) -> None:
    try:
        client = await connect_with_retry(where, attempts=3)
    except RuntimeError as err:
        raise SystemExit(f"cannot reach Temporal at {where.temporal}: {err}") from None
    await ledger_command(args, client)
