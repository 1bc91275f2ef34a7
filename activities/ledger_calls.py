"""The control worker's activities: workflows cannot send updates to other workflows, so a
replica or node workflow asks the ledger through these."""

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel
from temporalio import activity
from temporalio.client import Client, WithStartWorkflowOperation, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError

from workflows.contracts import (
    Allocation,
    LedgerAck,
    LedgerState,
    ModelIdle,
    ModelName,
    NodeName,
    NodeNames,
    NodeRecord,
    PlacementRequest,
    ReleaseRequest,
    ReplicaRefs,
    Route,
    RoutingTable,
)
from workflows.ledger import ClusterLedgerWorkflow
from workflows.names import CONTROL_TASK_QUEUE, LEDGER_WORKFLOW_ID, ControlActivity

R = TypeVar("R", bound=BaseModel)


async def update_ledger(client: Client, update: str, arg: BaseModel, result_type: type[R]) -> R:
    """Send an update to the ledger, starting it first if this is a brand-new cluster."""
    start = WithStartWorkflowOperation(
        ClusterLedgerWorkflow.run,
        LedgerState(),
        id=LEDGER_WORKFLOW_ID,
        task_queue=CONTROL_TASK_QUEUE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    try:
        result: R = await client.execute_update_with_start_workflow(
            update, arg, start_workflow_operation=start, result_type=result_type
        )
        return result
    except WorkflowUpdateFailedError as err:
        cause: Any = err.cause
        if isinstance(cause, ApplicationError):
            # Hand the ledger's refusal (e.g. NoPlacement with its reasons) to the caller as is.
            raise ApplicationError(
                cause.message, *cause.details, type=cause.type, non_retryable=True
            ) from err
        raise


async def query_ledger(client: Client, query: str, result_type: type[R], *args: BaseModel) -> R:
    result: R = await client.get_workflow_handle(LEDGER_WORKFLOW_ID).query(
        query, *args, result_type=result_type
    )
    return result


class LedgerActivities:
    def __init__(self, client: Client) -> None:
        self.client = client

    def all(self) -> list[Callable[..., Awaitable[BaseModel]]]:
        return [
            self.upsert_node,
            self.place,
            self.release,
            self.set_route,
            self.replicas_on_node,
            self.node_names,
            self.model_routes,
            self.set_idle,
        ]

    @activity.defn(name=ControlActivity.LEDGER_UPSERT_NODE)
    async def upsert_node(self, record: NodeRecord) -> LedgerAck:
        return await update_ledger(self.client, "upsert_node", record, LedgerAck)

    @activity.defn(name=ControlActivity.LEDGER_PLACE)
    async def place(self, req: PlacementRequest) -> Allocation:
        return await update_ledger(self.client, "place", req, Allocation)

    @activity.defn(name=ControlActivity.LEDGER_RELEASE)
    async def release(self, req: ReleaseRequest) -> LedgerAck:
        return await update_ledger(self.client, "release", req, LedgerAck)

    @activity.defn(name=ControlActivity.LEDGER_SET_ROUTE)
    async def set_route(self, route: Route) -> LedgerAck:
        return await update_ledger(self.client, "set_route", route, LedgerAck)

    @activity.defn(name=ControlActivity.LEDGER_REPLICAS_ON_NODE)
    async def replicas_on_node(self, node: NodeName) -> ReplicaRefs:
        return await query_ledger(self.client, "replicas_on", ReplicaRefs, node)

    @activity.defn(name=ControlActivity.LEDGER_NODE_NAMES)
    async def node_names(self) -> NodeNames:
        return await query_ledger(self.client, "node_names", NodeNames)

    @activity.defn(name=ControlActivity.LEDGER_MODEL_ROUTES)
    async def model_routes(self, model: ModelName) -> RoutingTable:
        return await query_ledger(self.client, "model_routes", RoutingTable, model)

    @activity.defn(name=ControlActivity.LEDGER_SET_IDLE)
    async def set_idle(self, idle: ModelIdle) -> LedgerAck:
        return await update_ledger(self.client, "set_idle", idle, LedgerAck)
