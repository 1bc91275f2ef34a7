"""One cell of the cluster ledger, as the control worker and the CLI reach it: its workflow
handle, updates (starting a cell that never ran) and queries. What spans cells is in
ledger_cluster.py."""

import asyncio
import random
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.workflow import UpdateMethodMultiParam

from workflows.contracts import LedgerState
from workflows.ledger import ClusterLedgerWorkflow
from workflows.names import CONTROL_TASK_QUEUE, ledger_cell_workflow_id

A = TypeVar("A", bound=BaseModel)
T = TypeVar("T")

LEDGER_CLOSED = "LedgerClosed"
# How long on_cell asks a busy cell again before giving up (the activity then retries).
QUERY_RETRY_S = 30.0
# How long one query to a cell may take: a query waits for the cell's worker, and one that is
# stuck would otherwise hold every placement that asks it.
QUERY_TIMEOUT_S = 10.0
# A process remembers a cluster's cell count once it can no longer change (LedgerCells.fixed).
_FIXED_CELLS: "weakref.WeakKeyDictionary[Client, int]" = weakref.WeakKeyDictionary()


def ledger_closed(cell: int = 0) -> ApplicationError:
    """Retryable on purpose: every caller's activity keeps retrying (and the Temporal UI and the
    control worker's log show this message) until the operator rebuilds the ledger, then goes on
    where it stopped."""
    message = (
        f"the cluster ledger workflow ({ledger_cell_workflow_id(cell)!r}) is closed (terminated?): "
        "nothing can be placed, released or routed until it is rebuilt; run `llmgw ledger "
        "rebuild`"
    )
    return ApplicationError(message, type=LEDGER_CLOSED)


def ledger_handle(client: Client, cell: int = 0) -> WorkflowHandle[ClusterLedgerWorkflow, None]:
    """One cell's ledger workflow (cell 0: `cluster`), typed: its updates and queries go by
    method reference (`ClusterLedgerWorkflow.place`), which also gives their result types.

    Not get_workflow_handle_for(ClusterLedgerWorkflow.run, ...): once a run method with an
    optional parameter (this one) went through that, mypy 2.4 infers Never for every later one
    with a required parameter (ModelWorkflow.run), in any module."""
    handle: WorkflowHandle[ClusterLedgerWorkflow, None] = client.get_workflow_handle(
        ledger_cell_workflow_id(cell)
    )
    return handle


async def ledger_cells(client: Client) -> int:
    """How many cells the cluster's ledger has (workflows/ledger_cells.py); 1 before it has a
    ledger at all."""
    cached = _FIXED_CELLS.get(client)
    if cached is not None:
        return cached
    try:
        answer = await ledger_handle(client).query(ClusterLedgerWorkflow.cells)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return 1
        raise
    if answer.fixed:
        _FIXED_CELLS[client] = answer.cells
    return answer.cells


async def on_cell(
    client: Client,
    cell: int,
    ask: Callable[[WorkflowHandle[ClusterLedgerWorkflow, None]], Awaitable[T]],
) -> T | None:
    """A query on one cell: `await on_cell(client, 2, lambda h: h.query(...))`; None when that
    cell has no ledger yet (no node of it has registered).

    While a cell runs a workflow task (an update), Temporal holds a query back until it ends,
    and refuses more than it holds (one, by default: "consistent query buffer is full",
    RESOURCE_EXHAUSTED). Every placement queries every cell, so with a few in flight that is
    the usual answer from the cell being placed in: asked again after a short wait, for up to
    QUERY_RETRY_S, then raised. Each try is bounded by QUERY_TIMEOUT_S: a cell whose worker
    does not answer fails the call (an activity is then retried) rather than holding it."""
    handle = ledger_handle(client, cell)
    deadline = time.monotonic() + QUERY_RETRY_S
    wait = 0.005
    while True:
        try:
            async with asyncio.timeout(QUERY_TIMEOUT_S):
                return await ask(handle)
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND and cell != 0:
                return None
            if err.status != RPCStatusCode.RESOURCE_EXHAUSTED or time.monotonic() > deadline:
                raise
        # Jittered, so queries refused together are not asked again together.
        await asyncio.sleep(wait * (0.5 + random.random()))
        wait = min(wait * 2, 0.2)


async def update_ledger(
    client: Client,
    update: UpdateMethodMultiParam[[ClusterLedgerWorkflow, A], T],
    arg: A,
    cell: int = 0,
) -> T:
    """Send an update to one cell's ledger, starting it first if it never ran:
    `await update_ledger(client, ClusterLedgerWorkflow.release, req)`.

    Never over a closed one: the ledger is the only record of who holds which GPU, and an empty
    ledger started in its place would hand every device out again. Only `llmgw ledger rebuild`
    starts a ledger run where one existed. The update goes to the running ledger directly (not
    update-with-start, which some servers refuse once the ledger has continued as new); only a
    cell that never had a ledger gets one started here."""
    handle = ledger_handle(client, cell)
    try:
        return await _send(handle, update, arg)
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
    status = await ledger_status(client, cell)
    if status is None:
        await start_ledger(client, cell)
    elif status != WorkflowExecutionStatus.RUNNING:
        raise ledger_closed(cell)
    # Started just now, or it was between two runs (continue-as-new) when the update came.
    return await _send(handle, update, arg)


async def _send(
    handle: WorkflowHandle[ClusterLedgerWorkflow, None],
    update: UpdateMethodMultiParam[[ClusterLedgerWorkflow, A], T],
    arg: A,
) -> T:
    try:
        return await handle.execute_update(update, arg)
    except WorkflowUpdateFailedError as err:
        cause: Any = err.cause
        if isinstance(cause, ApplicationError):
            # Hand the ledger's refusal (e.g. NoPlacement with its reasons) to the caller as is.
            raise ApplicationError(
                cause.message, *cause.details, type=cause.type, non_retryable=True
            ) from err
        raise


async def ledger_status(client: Client, cell: int = 0) -> WorkflowExecutionStatus | None:
    """A cell's ledger status; None when it never had one."""
    try:
        described = await ledger_handle(client, cell).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return described.status


async def start_ledger(client: Client, cell: int = 0) -> None:
    """Start a cell's ledger where none ran (a no-op while it runs); LedgerClosed where one
    ran. Cell 0 starts as one cell; a later cell only once cell 0 says there are more."""
    cells = 1 if cell == 0 else await ledger_cells(client)
    if cell >= cells:
        raise ApplicationError(
            f"the ledger has {cells} cell(s): no cell {cell}", type=LEDGER_CLOSED
        )
    try:
        await client.start_workflow(
            ClusterLedgerWorkflow.run,
            LedgerState(cells=cells, cell=cell),
            id=ledger_cell_workflow_id(cell),
            task_queue=CONTROL_TASK_QUEUE,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
        )
    except WorkflowAlreadyStartedError:
        raise ledger_closed(cell) from None
