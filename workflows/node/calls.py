"""The node workflow's calls out: the control plane's engine plan and the ledger's records, and
the checks it asks of the node's agent (discovery, engine re-verification, the liveness watch),
each with its timeouts and retries.

Each only makes the call the node workflow (workflows/node/workflow.py) asks for, when it asks: the
workflow decides, these say how a call is made.
"""

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.workflow import ActivityHandle

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.contracts import (
        DiscoverRequest,
        EnginePlan,
        EnginePlanRequest,
        EngineStatus,
        LedgerAck,
        NodeInventory,
        NodeName,
        NodeRecord,
        NodeView,
        NodeWatch,
        NodeWatchReport,
        ReplicaRefs,
        VerifyEnginesRequest,
        VerifyEnginesResult,
    )
    from workflows.names import ControlActivity, NodeActivity


async def plan_engines(view: NodeView) -> EnginePlan:
    """Which engines this node gets, from the cluster's `engines:` config."""
    record = view.record
    plan: EnginePlan = await workflow.execute_activity(
        ControlActivity.ENGINE_PLAN,
        EnginePlanRequest(
            inventory=record.inventory,
            labels=record.labels,
            engine_paths=view.engine_paths,
            disabled_engines=view.disabled_engines,
        ),
        start_to_close_timeout=options.ENGINE_PLAN_TIMEOUT,
        retry_policy=options.LEDGER_RETRY,
        result_type=EnginePlan,
    )
    return plan


def start_discover(node: str, queue: str) -> ActivityHandle[NodeInventory]:
    """Look at the machine again (its agent's discovery)."""
    return workflow.start_activity(
        NodeActivity.DISCOVER,
        DiscoverRequest(node=node),
        task_queue=queue,
        start_to_close_timeout=options.DISCOVER_TIMEOUT,
        retry_policy=options.NODE_CHECK_RETRY,
        result_type=NodeInventory,
    )


def start_verify(
    node: str, queue: str, engines: list[EngineStatus]
) -> ActivityHandle[VerifyEnginesResult]:
    """Run each of `engines` again on the node."""
    return workflow.start_activity(
        NodeActivity.VERIFY_ENGINES,
        VerifyEnginesRequest(node=node, engines=engines),
        task_queue=queue,
        start_to_close_timeout=options.VERIFY_ENGINES_TIMEOUT,
        retry_policy=options.NODE_CHECK_RETRY,
        result_type=VerifyEnginesResult,
    )


# A watch is never retried by the server: each of its timeouts is what the workflow judges
# liveness by (workflows/node/watch.py), and a retry would hide it.
WATCH_ONCE = RetryPolicy(maximum_attempts=1)


def start_watch(
    queue: str, watch: NodeWatch, window: timedelta, heartbeat_timeout: timedelta
) -> ActivityHandle[NodeWatchReport]:
    """The node's liveness watch: an agent must take it within `window` and then heartbeat at
    least every `heartbeat_timeout`; it returns after `watch.report_after_s`, or sooner."""
    return workflow.start_activity(
        NodeActivity.WATCH_LIVENESS,
        watch,
        task_queue=queue,
        schedule_to_start_timeout=window,
        # Bounded like every activity on a node's queue: the agent returns at report_after_s.
        start_to_close_timeout=timedelta(seconds=watch.report_after_s) + 2 * heartbeat_timeout,
        heartbeat_timeout=heartbeat_timeout,
        retry_policy=WATCH_ONCE,
        result_type=NodeWatchReport,
    )


async def replicas_on(node: str) -> ReplicaRefs:
    """The replicas the ledger has placed on `node`."""
    refs: ReplicaRefs = await workflow.execute_activity(
        ControlActivity.LEDGER_REPLICAS_ON_NODE,
        NodeName(name=node),
        start_to_close_timeout=options.LEDGER_CALL_TIMEOUT,
        retry_policy=options.LEDGER_RETRY,
        result_type=ReplicaRefs,
    )
    return refs


async def upsert_node(record: NodeRecord) -> None:
    """Copy the node's record to the ledger, which placement reads."""
    await workflow.execute_activity(
        ControlActivity.LEDGER_UPSERT_NODE,
        record,
        start_to_close_timeout=options.LEDGER_CALL_TIMEOUT,
        retry_policy=options.LEDGER_RETRY,
        result_type=LedgerAck,
    )
