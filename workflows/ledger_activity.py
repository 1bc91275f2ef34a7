"""A workflow's calls to the ledger, through the control worker's activities (workflows cannot
send updates to other workflows). Quick and idempotent: retried briskly."""

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.contracts import (
        LedgerAck,
        NodeName,
        NodeState,
        NodeStatus,
        ReleaseRequest,
        Route,
    )
    from workflows.names import ControlActivity


async def call_ledger(activity_name: str, arg: Route | ReleaseRequest) -> LedgerAck:
    ack: LedgerAck = await workflow.execute_activity(
        activity_name,
        arg,
        start_to_close_timeout=options.LEDGER_CALL_TIMEOUT,
        retry_policy=options.LEDGER_RETRY,
        result_type=LedgerAck,
    )
    return ack


async def node_gone(node: str) -> bool:
    """Whether the ledger counts `node` gone (lost or removed, or no longer known): what it ran
    can no longer hold anything, so what it held may be freed."""
    status: NodeStatus = await workflow.execute_activity(
        ControlActivity.LEDGER_NODE_STATE,
        NodeName(name=node),
        start_to_close_timeout=options.LEDGER_CALL_TIMEOUT,
        retry_policy=options.LEDGER_RETRY,
        result_type=NodeStatus,
    )
    return status.state is None or status.state in NodeState.gone()
