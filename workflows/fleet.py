"""The short workflows Temporal Schedules start: each looks at the whole fleet once.

Re-verification and inventory refresh signal every node's workflow, which does the work with
its own agent; scheduled onboarding expects every node listed in the operator's nodes file.
"""

import asyncio

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    import workflows.history_budget as history_budget
    from workflows import options
    from workflows.contracts import (
        NodeAdd,
        NodeNames,
        NodeRefresh,
        NodesFile,
        NodesFileRequest,
        NodeView,
        OnboardingProgress,
    )
    from workflows.names import ControlActivity, node_workflow_id
    from workflows.node.workflow import NodeWorkflow

# Retired (docs/workflow-versions.md): their old branches are gone; deprecate_patch() still
# replays the histories that carry their markers.
SIGNALS_IN_BATCHES = "fleet-refresh-signals-in-batches"
ONBOARDING_IN_BATCHES = "scheduled-onboarding-in-batches"
SIGNAL_BATCH = 100


@workflow.defn(name="FleetRefresh")
class FleetRefreshWorkflow:
    @workflow.run
    async def run(self, req: NodeRefresh) -> NodeNames:
        names = req.nodes
        if names is None:
            nodes: NodeNames = await workflow.execute_activity(
                ControlActivity.LEDGER_NODE_NAMES,
                start_to_close_timeout=options.LEDGER_CALL_TIMEOUT,
                retry_policy=options.LEDGER_RETRY,
                result_type=NodeNames,
            )
            names = nodes.names
        workflow.deprecate_patch(SIGNALS_IN_BATCHES)
        told: list[str] = []
        # A batch of signals costs one workflow task, not one each: at 10,000 nodes one at a
        # time would be about 50,000 events, at Temporal's limit.
        while names:
            batch, names = names[:SIGNAL_BATCH], names[SIGNAL_BATCH:]
            sent = await asyncio.gather(*(self._tell(n, req) for n in batch))
            told += [n for n, ok in zip(batch, sent, strict=True) if ok]
            if names and history_budget.time_to_continue():
                refresh = NodeRefresh(inventory=req.inventory, engines=req.engines, nodes=names)
                workflow.continue_as_new(refresh)
        return NodeNames(names=told)

    @staticmethod
    async def _tell(name: str, req: NodeRefresh) -> bool:
        asked = NodeRefresh(inventory=req.inventory, engines=req.engines)
        try:
            await workflow.get_external_workflow_handle(node_workflow_id(name)).signal(
                NodeWorkflow.refresh, asked
            )
            return True
        except ApplicationError as err:  # removed since the ledger was read
            workflow.logger.warning("could not refresh %s: %s", name, err)
            return False


@workflow.defn(name="ScheduledOnboarding")
class ScheduledOnboardingWorkflow:
    @workflow.run
    async def run(self, carried: OnboardingProgress | None = None) -> NodeNames:
        """Started by its schedule with no argument; a continued run gets the nodes left."""
        if carried is None:
            listed: NodesFile = await workflow.execute_activity(
                ControlActivity.READ_NODES_FILE,
                NodesFileRequest(),
                start_to_close_timeout=options.LEDGER_CALL_TIMEOUT,
                retry_policy=options.NODE_CHECK_RETRY,
                result_type=NodesFile,
            )
            carried = OnboardingProgress(nodes=listed.nodes)
        workflow.deprecate_patch(ONBOARDING_IN_BATCHES)
        nodes, added = carried.nodes, carried.added
        # As FleetRefresh: a batch costs a workflow task, not one per node, and a long list
        # continues as new with the nodes still to add.
        while nodes:
            batch, nodes = nodes[:SIGNAL_BATCH], nodes[SIGNAL_BATCH:]
            await asyncio.gather(*(self._add(node) for node in batch))
            added += [node.name for node in batch]
            if nodes and history_budget.time_to_continue():
                workflow.continue_as_new(OnboardingProgress(nodes=nodes, added=added))
        return NodeNames(names=added)

    @staticmethod
    async def _add(node: NodeAdd) -> None:
        await workflow.execute_activity(
            ControlActivity.ADD_NODE,
            node,
            start_to_close_timeout=options.LEDGER_CALL_TIMEOUT,
            retry_policy=options.LEDGER_RETRY,
            result_type=NodeView,
        )
