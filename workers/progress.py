"""What the cluster is doing, in words: for `llmgw up` while it waits and for `llmgw nodes`."""

import asyncio
from datetime import timedelta
from typing import Any

from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.service import RPCError, RPCStatusCode

from activities.control.ledger_calls import ledger_handle
from workflows.contracts import EngineState, LedgerState, NodeRecord
from workflows.ledger import ClusterLedgerWorkflow
from workflows.ledger_cells import merge_states
from workflows.ledger_compact import unpack_state
from workflows.names import engine_install_workflow_id


async def ledger_snapshot(client: Client) -> LedgerState:
    """The ledger's whole state, every cell's merged (workflows/ledger_cells.py), each read
    compressed: the plain `snapshot` query's answer outgrows gRPC's 4 MB message limit at
    about 500 eight-GPU nodes running 2,000 replicas (`llmgw bench placement`)."""
    first = await _cell_snapshot(client, 0)
    if first is None or first.cells <= 1:
        return first or LedgerState()
    rest = await asyncio.gather(*(_cell_snapshot(client, c) for c in range(1, first.cells)))
    return merge_states([first, *(s for s in rest if s is not None)])


# A query goes to the worker that last ran the ledger (its sticky queue). When that worker has
# just died, Temporal holds the query there until it sees the worker gone (about 10 s without a
# poll) and only then sends it to the other control workers; a query caught in that window
# times out. Ask again rather than fail `llmgw status` because a control worker died. Each try
# leaves room past that window for another worker to replay a large cell (seconds at 500 nodes).
QUERY_TIMEOUT = timedelta(seconds=30)
QUERY_TRIES = 3
_TRANSIENT = (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED, RPCStatusCode.UNAVAILABLE)


async def _cell_snapshot(client: Client, cell: int) -> LedgerState | None:
    """One cell's state; None for a cell whose ledger has not started (no node of it yet)."""
    handle = ledger_handle(client, cell)
    tries = 0
    while True:
        tries += 1
        try:
            packed = await handle.query(
                ClusterLedgerWorkflow.packed_snapshot, rpc_timeout=QUERY_TIMEOUT
            )
        except WorkflowQueryFailedError:
            # A control worker from before the packed query: the plain one still answers there.
            return await handle.query(ClusterLedgerWorkflow.snapshot, rpc_timeout=QUERY_TIMEOUT)
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND and cell != 0:
                return None
            if err.status in _TRANSIENT and tries < QUERY_TRIES:
                continue
            raise
        return unpack_state(packed)


async def install_progress(client: Client, node: str, engine: str, version: str) -> str:
    """The install activity's latest heartbeat ("building llama-server 45%"), as the Temporal UI
    shows it; empty when there is none."""
    handle = client.get_workflow_handle(engine_install_workflow_id(node, engine, version))
    try:
        described = await handle.describe()
    except RPCError:  # not started yet (NOT_FOUND), or Temporal not answering: no progress
        return ""
    for pending in described.raw_description.pending_activities:
        if pending.heartbeat_details.payloads:
            values: list[Any] = await client.data_converter.decode(
                pending.heartbeat_details.payloads
            )
            if values:
                return str(values[-1])
    return ""


async def engine_lines(client: Client, record: NodeRecord) -> list[str]:
    lines = []
    for status in record.engines.values():
        text = f"{status.engine} {status.version}: {status.state.value}"
        if status.state == EngineState.INSTALLING:
            progress = await install_progress(
                client, record.inventory.name, status.engine, status.version
            )
            if progress:
                text += f" ({progress})"
        elif status.state == EngineState.INSTALLED and status.verified_at:
            text += f" (verified {status.verified_at.replace('T', ' ')[:16]} UTC)"
        elif status.detail:
            text += f" ({status.detail})"
        lines.append(text)
    return lines
