"""`llmgw node bootstrap` asks the control plane about the node it joins: whether Temporal
answers at the token's address with these TLS settings, what the node workflow holds, and, after
the service starts, whether the node came up."""

import asyncio
from datetime import timedelta

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities.control.node_admin import node_handle
from workflows.client import connect
from workflows.contracts import NodeState, NodeView
from workflows.node.workflow import NodeWorkflow
from workflows.temporal_security import TemporalSecurity

CONNECT_WITHIN_S = 10.0
ANSWER_WITHIN = timedelta(seconds=10)


async def reach(temporal: str, namespace: str, security: TemporalSecurity) -> Client:
    try:
        return await asyncio.wait_for(connect(temporal, namespace, security), CONNECT_WITHIN_S)
    except (RuntimeError, OSError, TimeoutError) as err:
        why = str(err) or f"no answer within {CONNECT_WITHIN_S:g}s"
        raise ValueError(
            f"cannot reach the control plane's Temporal at {temporal} ({security.describe()}, "
            f"namespace {namespace}): {why}"
        ) from None


async def node_view(client: Client, node: str) -> NodeView | None:
    """The node workflow's view; None when there is no such workflow."""
    try:
        return await node_handle(client, node).query(
            NodeWorkflow.describe, rpc_timeout=ANSWER_WITHIN
        )
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        if err.status == RPCStatusCode.DEADLINE_EXCEEDED:
            raise ValueError(
                f"Temporal answers, but nothing answered for node {node!r} within "
                f"{ANSWER_WITHIN.seconds}s: is the control worker (`llmgw control`) running?"
            ) from None
        raise ValueError(f"asking the control plane about node {node!r}: {err}") from None


async def wait_ready(client: Client, node: str, machine_id: str, within_s: float) -> str:
    """The node's state once it is ready on this machine, or its last state at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    state = "unknown"
    while True:
        try:
            view = await node_view(client, node)
        except ValueError:
            view = None
        if view is not None:
            record = view.record
            state = record.state.value + (f" ({record.note})" if record.note else "")
            here = record.inventory.machine_id in ("", machine_id)
            if record.state == NodeState.READY and here:
                return state
        if loop.time() >= deadline:
            return state
        await asyncio.sleep(1.0)
