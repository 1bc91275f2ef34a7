"""The model workflow's calls out: its engines' load, its idle flag in the ledger, and whether
its replica workflows still run, each with its timeouts and retries.

Each only makes the call the model workflow (workflows/model.py) asks for, when it asks: the
workflow decides, these say how a call is made.
"""

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.contracts import (
        EngineLoad,
        EngineLoadReport,
        EngineLoadRequest,
        LedgerAck,
        ModelIdle,
        ModelName,
        ReplicaState,
        RoutingTable,
        WorkflowIds,
        WorkflowStatuses,
    )
    from workflows.names import ControlActivity, NodeActivity, node_task_queue


async def engine_loads(model: str) -> list[EngineLoad]:
    """Each serving replica's load, asked of the agent on its node (which holds the keys
    the engines' metrics want). A node that does not answer counts as unseen, not idle."""
    table: RoutingTable = await workflow.execute_activity(
        ControlActivity.LEDGER_MODEL_ROUTES,
        ModelName(name=model),
        start_to_close_timeout=options.LEDGER_CALL_TIMEOUT,
        retry_policy=options.LEDGER_RETRY,
        result_type=RoutingTable,
    )
    by_node: dict[str, list[str]] = {}
    for route in table.routes:
        if route.state in ReplicaState.routable():
            by_node.setdefault(route.node, []).append(route.replica_id)
    loads: list[EngineLoad] = []
    for node, replica_ids in sorted(by_node.items()):
        try:
            report: EngineLoadReport = await workflow.execute_activity(
                NodeActivity.ENGINE_LOAD,
                EngineLoadRequest(replica_ids=replica_ids),
                task_queue=node_task_queue(node),
                schedule_to_close_timeout=options.ENGINE_LOAD_TIMEOUT,
                retry_policy=options.ENGINE_LOAD_RETRY,
                result_type=EngineLoadReport,
            )
            loads.extend(report.engines)
        except ActivityError:
            loads.extend(EngineLoad(replica_id=r, seen=False) for r in replica_ids)
    return loads


async def set_idle(model: str, idle: bool) -> None:
    """Tell the ledger (and so every gateway) whether a request should wake `model`."""
    await workflow.execute_activity(
        ControlActivity.LEDGER_SET_IDLE,
        ModelIdle(model=model, idle=idle),
        start_to_close_timeout=options.LEDGER_CALL_TIMEOUT,
        retry_policy=options.LEDGER_RETRY,
        result_type=LedgerAck,
    )


async def workflow_statuses(workflow_ids: list[str]) -> WorkflowStatuses:
    """Whether each workflow still runs, as Temporal answers; an ActivityError when it does
    not answer (which proves nothing)."""
    statuses: WorkflowStatuses = await workflow.execute_activity(
        ControlActivity.DESCRIBE_WORKFLOWS,
        WorkflowIds(workflow_ids=workflow_ids),
        start_to_close_timeout=options.DESCRIBE_WORKFLOWS_TIMEOUT,
        schedule_to_close_timeout=options.DESCRIBE_WORKFLOWS_GIVE_UP,
        retry_policy=options.LEDGER_RETRY,
        result_type=WorkflowStatuses,
    )
    return statuses
