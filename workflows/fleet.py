"""The short workflows Temporal Schedules start: each looks at the whole fleet once.

Re-verification and inventory refresh signal every node's workflow, which does the work with
its own agent; scheduled onboarding expects every node listed in the operator's nodes file.
"""

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.contracts import (
        NodeNames,
        NodeRefresh,
        NodesFile,
        NodesFileRequest,
        NodeView,
    )
    from workflows.names import CONTROL_TASK_QUEUE, ControlActivity, node_workflow_id


@workflow.defn(name="FleetRefresh")
class FleetRefreshWorkflow:
    @workflow.run
    async def run(self, req: NodeRefresh) -> NodeNames:
        nodes: NodeNames = await workflow.execute_activity(
            ControlActivity.LEDGER_NODE_NAMES,
            start_to_close_timeout=options.LEDGER_CALL_TIMEOUT,
            retry_policy=options.LEDGER_RETRY,
            result_type=NodeNames,
        )
        told = []
        for name in nodes.names:
            try:
                await workflow.get_external_workflow_handle(node_workflow_id(name)).signal(
                    "refresh", req
                )
                told.append(name)
            except ApplicationError as err:  # removed since the ledger was read
                workflow.logger.warning("could not refresh %s: %s", name, err)
        return NodeNames(names=told)


@workflow.defn(name="ScheduledOnboarding")
class ScheduledOnboardingWorkflow:
    @workflow.run
    async def run(self) -> NodeNames:
        listed: NodesFile = await workflow.execute_activity(
            ControlActivity.READ_NODES_FILE,
            NodesFileRequest(),
            start_to_close_timeout=options.LEDGER_CALL_TIMEOUT,
            retry_policy=options.NODE_CHECK_RETRY,
            result_type=NodesFile,
        )
        added = []
        for node in listed.nodes:
            await workflow.execute_activity(
                ControlActivity.ADD_NODE,
                node,
                task_queue=CONTROL_TASK_QUEUE,
                start_to_close_timeout=options.LEDGER_CALL_TIMEOUT,
                retry_policy=options.LEDGER_RETRY,
                result_type=NodeView,
            )
            added.append(node.name)
        return NodeNames(names=added)
