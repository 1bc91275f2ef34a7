"""The control worker's activities: workflows cannot send updates to other workflows, so a
replica or node workflow asks the ledger through these."""

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel
from temporalio import activity
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.workflow import UpdateMethodMultiParam

from workflows.contracts import (
    Allocation,
    AllocationLookup,
    LedgerAck,
    LedgerState,
    ModelIdle,
    ModelName,
    NodeName,
    NodeNames,
    NodeRecord,
    NodeStatus,
    PlacementRefusal,
    PlacementRequest,
    ReleaseRequest,
    ReplicaAllocation,
    ReplicaRefs,
    Route,
    RoutingTable,
)
from workflows.ledger import NO_PLACEMENT, ClusterLedgerWorkflow
from workflows.names import CONTROL_TASK_QUEUE, LEDGER_WORKFLOW_ID, ControlActivity

A = TypeVar("A", bound=BaseModel)
T = TypeVar("T")

LEDGER_CLOSED = "LedgerClosed"
LEDGER_CLOSED_MESSAGE = (
    f"the cluster ledger workflow ({LEDGER_WORKFLOW_ID!r}) is closed (terminated?): nothing can "
    "be placed, released or routed until it is rebuilt; run `llmgw ledger rebuild`"
)


def ledger_closed() -> ApplicationError:
    """Retryable on purpose: every caller's activity keeps retrying (and the Temporal UI and the
    control worker's log show this message) until the operator rebuilds the ledger, then goes on
    where it stopped."""
    return ApplicationError(LEDGER_CLOSED_MESSAGE, type=LEDGER_CLOSED)


def ledger_handle(client: Client) -> WorkflowHandle[ClusterLedgerWorkflow, None]:
    """The `cluster` workflow, typed: its updates and queries go by method reference
    (`ClusterLedgerWorkflow.place`), which also gives their result types.

    Not get_workflow_handle_for(ClusterLedgerWorkflow.run, ...): once a run method with an
    optional parameter (this one) went through that, mypy 2.4 infers Never for every later one
    with a required parameter (ModelWorkflow.run), in any module."""
    handle: WorkflowHandle[ClusterLedgerWorkflow, None] = client.get_workflow_handle(
        LEDGER_WORKFLOW_ID
    )
    return handle


async def allocate(client: Client, req: PlacementRequest) -> Allocation:
    """Place one replica, a refusal raised as the NoPlacement error (non-retryable) with the
    reasons summarised: for the CLI, tests and the placement bench; replicas use
    place_replica()."""
    decision = await place_replica(client, req)
    if isinstance(decision, PlacementRefusal):
        message = f"no node can take {decision.replica_id}: {decision.summary}"
        raise ApplicationError(message, type=NO_PLACEMENT, non_retryable=True)
    return decision


async def place_replica(client: Client, req: PlacementRequest) -> Allocation | PlacementRefusal:
    """The ledger's placement: an allocation, or why there is none, summarised."""
    return await update_ledger(client, ClusterLedgerWorkflow.place, req)


async def update_ledger(
    client: Client, update: UpdateMethodMultiParam[[ClusterLedgerWorkflow, A], T], arg: A
) -> T:
    """Send an update to the ledger, starting it first if this is a brand-new cluster:
    `await update_ledger(client, ClusterLedgerWorkflow.release, req)`.

    Never over a closed one: the ledger is the only record of who holds which GPU, and an empty
    ledger started in its place would hand every device out again. Only `llmgw ledger rebuild`
    starts a `cluster` run where one existed. The update goes to the running ledger directly (not
    update-with-start, which some servers refuse once the ledger has continued as new); only a
    cluster that never had a ledger gets one started here."""
    handle = ledger_handle(client)
    try:
        return await _send(handle, update, arg)
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
    status = await ledger_status(client)
    if status is None:
        await start_ledger(client)
    elif status != WorkflowExecutionStatus.RUNNING:
        raise ledger_closed()
    # Started just now, or it was between two runs (continue-as-new) when the update came.
    return await _send(handle, update, arg)


async def _send(
    handle: WorkflowHandle[ClusterLedgerWorkflow, None],
    update: UpdateMethodMultiParam[[ClusterLedgerWorkflow, A], T],
    arg: A,
) -> T:
    try:
        return await handle.execute_update(update, arg)
    except WorkflowUpdateFailedError as err:
        cause: Any = err.cause
        if isinstance(cause, ApplicationError):
            # Hand the ledger's refusal (e.g. NoPlacement with its reasons) to the caller as is.
            raise ApplicationError(
                cause.message, *cause.details, type=cause.type, non_retryable=True
            ) from err
        raise


async def ledger_status(client: Client) -> WorkflowExecutionStatus | None:
    """The ledger's status; None when this cluster never had one."""
    try:
        described = await ledger_handle(client).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return described.status


async def start_ledger(client: Client) -> None:
    """Start the ledger of a new cluster (a no-op while it runs); LedgerClosed where one ran."""
    try:
        await client.start_workflow(
            ClusterLedgerWorkflow.run,
            LedgerState(),
            id=LEDGER_WORKFLOW_ID,
            task_queue=CONTROL_TASK_QUEUE,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
        )
    except WorkflowAlreadyStartedError:
        raise ledger_closed() from None


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
            self.node_state,
            self.allocation,
        ]

    @activity.defn(name=ControlActivity.LEDGER_UPSERT_NODE)
    async def upsert_node(self, record: NodeRecord) -> LedgerAck:
        return await update_ledger(self.client, ClusterLedgerWorkflow.upsert_node, record)

    @activity.defn(name=ControlActivity.LEDGER_PLACE)
    async def place(self, req: PlacementRequest) -> Allocation | PlacementRefusal:
        return await place_replica(self.client, req)

    @activity.defn(name=ControlActivity.LEDGER_RELEASE)
    async def release(self, req: ReleaseRequest) -> LedgerAck:
        return await update_ledger(self.client, ClusterLedgerWorkflow.release, req)

    @activity.defn(name=ControlActivity.LEDGER_SET_ROUTE)
    async def set_route(self, route: Route) -> LedgerAck:
        return await update_ledger(self.client, ClusterLedgerWorkflow.set_route, route)

    @activity.defn(name=ControlActivity.LEDGER_REPLICAS_ON_NODE)
    async def replicas_on_node(self, node: NodeName) -> ReplicaRefs:
        return await ledger_handle(self.client).query(ClusterLedgerWorkflow.replicas_on, node)

    @activity.defn(name=ControlActivity.LEDGER_NODE_NAMES)
    async def node_names(self) -> NodeNames:
        return await ledger_handle(self.client).query(ClusterLedgerWorkflow.node_names)

    @activity.defn(name=ControlActivity.LEDGER_MODEL_ROUTES)
    async def model_routes(self, model: ModelName) -> RoutingTable:
        return await ledger_handle(self.client).query(ClusterLedgerWorkflow.model_routes, model)

    @activity.defn(name=ControlActivity.LEDGER_SET_IDLE)
    async def set_idle(self, idle: ModelIdle) -> LedgerAck:
        return await update_ledger(self.client, ClusterLedgerWorkflow.set_idle, idle)

    @activity.defn(name=ControlActivity.LEDGER_ALLOCATION)
    async def allocation(self, req: AllocationLookup) -> ReplicaAllocation:
        return await ledger_handle(self.client).query(ClusterLedgerWorkflow.allocation, req)

    @activity.defn(name=ControlActivity.LEDGER_NODE_STATE)
    async def node_state(self, node: NodeName) -> NodeStatus:
        return await ledger_handle(self.client).query(ClusterLedgerWorkflow.node_state, node)
