"""What the cluster is doing, in words: for `llmgw up` while it waits and for `llmgw nodes`."""

from typing import Any

from temporalio.client import Client

from workflows.contracts import EngineState, LedgerState, NodeRecord
from workflows.names import LEDGER_WORKFLOW_ID, engine_install_workflow_id


async def ledger_snapshot(client: Client) -> LedgerState:
    handle = client.get_workflow_handle(LEDGER_WORKFLOW_ID)
    state: LedgerState = await handle.query("snapshot", result_type=LedgerState)
    return state


async def install_progress(client: Client, node: str, engine: str, version: str) -> str:
    """The install activity's latest heartbeat ("building llama-server 45%"), as the Temporal UI
    shows it; empty when there is none."""
    handle = client.get_workflow_handle(engine_install_workflow_id(node, engine, version))
    try:
        described = await handle.describe()
    except Exception:
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
        elif status.detail:
            text += f" ({status.detail})"
        lines.append(text)
    return lines
