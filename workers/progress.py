"""What the cluster is doing, in words: for `llmgw up` while it waits and for `llmgw nodes`."""

from typing import Any

from temporalio.client import Client
from temporalio.service import RPCError

from store.fleet import FleetTables, open_fleet
from workers.paths import Locations
from workflows.contracts import EngineState, LedgerState, NodeRecord
from workflows.names import engine_install_workflow_id


async def fleet_tables(where: Locations) -> FleetTables:
    """The fleet tables of the store `where` names, created if missing: for a command's one
    process (one connection)."""
    tables = open_fleet(where.database_url, where.state_dir, pool_size=1)
    await tables.init()
    return tables


async def ledger_snapshot(tables: FleetTables) -> LedgerState:
    """Every node, allocation, route and idle model the fleet tables hold, read together."""
    return await tables.snapshot()


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
