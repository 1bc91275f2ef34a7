"""A workflow's call to one of the ledger's updates, through the control worker's activity
(workflows cannot send updates to other workflows). Quick and idempotent: retried briskly."""

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.contracts import LedgerAck, ReleaseRequest, Route
    from workflows.names import CONTROL_TASK_QUEUE


async def call_ledger(activity_name: str, arg: Route | ReleaseRequest) -> LedgerAck:
    ack: LedgerAck = await workflow.execute_activity(
        activity_name,
        arg,
        task_queue=CONTROL_TASK_QUEUE,
        start_to_close_timeout=options.LEDGER_CALL_TIMEOUT,
        retry_policy=options.LEDGER_RETRY,
        result_type=LedgerAck,
    )
    return ack
