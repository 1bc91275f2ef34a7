"""The model workflow's calls out: its engines' load, its idle flag in the ledger, and whether
its replica workflows still run, each with its timeouts and retries.

Each only makes the call the model workflow (workflows/model/workflow.py) asks for, when it asks:
the
workflow decides, these say how a call is made.
"""

import asyncio

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.contracts import (
        EngineLoad,
        EngineLoadReport,
        EngineLoadRequest,
        LedgerAck,
        LoadTotals,
        ModelIdle,
        ModelLoadReport,
        ModelLoadRequest,
        ModelName,
        NodeReplicas,
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


async def engine_load_totals(model: str) -> LoadTotals | None:
    """The load of the model's serving replicas, summed, in one control activity that reads
    every hosting node's agent metrics (activities/control/model_load.py), plus the agents of at
    most options.LOAD_AGENTS_ASKED_PER_LOOK nodes it could not read, asked at once: a look costs
    a bounded number of history events whatever the replica and node count. None when the look
    itself failed: nothing is known, which is not idle."""
    try:
        report: ModelLoadReport = await workflow.execute_activity(
            ControlActivity.MODEL_LOAD,
            ModelLoadRequest(model=model, agents_to_ask=options.LOAD_AGENTS_ASKED_PER_LOOK),
            start_to_close_timeout=options.MODEL_LOAD_TIMEOUT,
            retry_policy=options.MODEL_LOAD_RETRY,
            result_type=ModelLoadReport,
        )
    except ActivityError:
        return None
    asked = await asyncio.gather(
        *(_agent_load(n) for n in report.ask_agents[: options.LOAD_AGENTS_ASKED_PER_LOOK])
    )
    totals = report.totals
    for found in asked:
        totals = totals.plus(found)
    return totals


async def _agent_load(node: NodeReplicas) -> LoadTotals:
    """One node's replicas' load, asked of its agent (which reads its engines with their keys);
    a node that does not answer leaves them unseen."""
    try:
        report: EngineLoadReport = await workflow.execute_activity(
            NodeActivity.ENGINE_LOAD,
            EngineLoadRequest(replica_ids=node.replica_ids),
            task_queue=node_task_queue(node.node),
            schedule_to_close_timeout=options.ENGINE_LOAD_TIMEOUT,
            retry_policy=options.ENGINE_LOAD_RETRY,
            result_type=EngineLoadReport,
        )
    except ActivityError:
        return LoadTotals(unseen=len(node.replica_ids))
    return LoadTotals.of(report.engines)


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


async def workflow_statuses_batched(workflow_ids: list[str]) -> WorkflowStatuses:
    """workflow_statuses in batches of options.REPLICA_CHECK_BATCH asked at once, so no payload
    grows past about 30 KB and each activity ends well inside its timeout. Any batch without an
    answer makes the whole check unanswered (after every batch has ended): an ActivityError."""
    batch = options.REPLICA_CHECK_BATCH
    answers = await asyncio.gather(
        *(
            workflow_statuses(workflow_ids[at : at + batch])
            for at in range(0, len(workflow_ids), batch)
        ),
        return_exceptions=True,
    )
    merged = WorkflowStatuses()
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer
        merged.running.update(answer.running)
        merged.closed.update(answer.closed)
    return merged
