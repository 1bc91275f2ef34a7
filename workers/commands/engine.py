"""`llmgw engine check NODE ENGINE`: verify one node's engine now rather than at its agent's next
look. The node's workflow is asked to re-verify its engines (its `refresh` signal, as the
`llmgw-engine-reverify` schedule sends it to every node) and the command prints what the agent
found, once the node has recorded it."""

import argparse
import asyncio
from datetime import UTC, datetime

from temporalio.client import Client

from activities.control.node_admin import node_handle
from workers.commands.node import describe
from workflows.contracts import EngineState, EngineStatus, NodeRefresh, NodeState
from workflows.node.workflow import NodeWorkflow

# Re-verifying a Python engine imports it in its own environment, and on an NVIDIA node asks
# torch for its devices: a minute is common on a loaded machine.
ANSWER_WITHIN_S = 180.0
CHECKABLE = (EngineState.INSTALLED, EngineState.FAILED)


async def check_engine(
    client: Client, node: str, engine: str, within_s: float = ANSWER_WITHIN_S
) -> EngineStatus:
    """Ask the node to verify its engines; the engine's status once the node records a new one."""
    view = await describe(client, node)
    if view is None or view.record.state == NodeState.REMOVED:
        raise SystemExit(f"no node {node!r}")
    before = view.record.engines.get(engine)
    if before is None:
        has = ", ".join(sorted(view.record.engines)) or "none"
        raise SystemExit(f"node {node} has no engine {engine!r} (it has: {has})")
    if before.state not in CHECKABLE or not before.path:
        why = f": {before.detail}" if before.detail else ""
        raise SystemExit(f"{engine} on {node} is {before.state.value}, nothing to check{why}")
    if view.record.state != NodeState.READY:
        raise SystemExit(f"node {node} is {view.record.state.value}: no agent answers it")
    # The record keeps when it was verified to the second: a check within the same second as
    # the last, with the same outcome, would look like no answer.
    if before.verified_at >= datetime.now(UTC).isoformat(timespec="seconds"):
        await asyncio.sleep(1.0)
    await node_handle(client, node).signal(NodeWorkflow.refresh, NodeRefresh(engines=True))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while loop.time() < deadline:
        await asyncio.sleep(0.5)
        view = await describe(client, node)
        now = view.record.engines.get(engine) if view is not None else None
        if now is not None and now != before:
            return now
    raise SystemExit(
        f"asked node {node} to verify its engines; no answer within {within_s:.0f}s "
        f"(`llmgw node show {node}` shows it when the agent reports)"
    )


def status_line(node: str, status: EngineStatus) -> str:
    # A failed check keeps when the engine was last seen to run.
    seen = "last seen running" if status.state == EngineState.FAILED else "verified"
    when = f" ({seen} {status.verified_at})" if status.verified_at else ""
    state = f"{status.state.value}{when}"
    return f"{status.engine} {status.version} on {node}: {state}: {status.detail}"


async def run_engine_command(client: Client, args: argparse.Namespace) -> None:
    status = await check_engine(client, args.node, args.engine)
    print(status_line(args.node, status))
    if status.state != EngineState.INSTALLED:
        raise SystemExit(1)


def add_engine_parsers(
    sub: "argparse._SubParsersAction[argparse.ArgumentParser]", common: argparse.ArgumentParser
) -> None:
    engine = sub.add_parser("engine", help="check a node's engine")
    esub = engine.add_subparsers(dest="action", required=True)
    check = esub.add_parser(
        "check", parents=[common], help="verify a node's engine now; exit 1 if it cannot run"
    )
    check.add_argument("node")
    check.add_argument("engine")
