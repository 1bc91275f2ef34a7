"""Replicas waiting for their weights hold none of the control worker's activity slots: with 300
replicas waiting on fetches held back for as long as the test likes, and a control worker that
runs at most 20 activities at a time, another replica is still placed, routed, started and
made ready; then the fetches finish and every waiting replica starts.

When a replica waited inside a control activity (control_await_artifact_fetch), 20 waits took
every slot and the newcomer's placement never ran: this test would time out at its first check.
The ledger is replaced by stand-ins registered under its activity names, so what is measured
is the control queue alone."""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.control.artifact_fetches import ArtifactFetchActivities
from tests.workflows.conftest import control_client, eventually, unique
from tests.workflows.fake_agent import FakeAgent
from tests.workflows.test_replica_fetch import ARTIFACT, artifact_spec
from workers.registry import CONTROL_WORKFLOWS
from workers.search_attributes import ensure_search_attributes
from workflows.artifact_fetch import ArtifactFetchWorkflow
from workflows.contracts import (
    Allocation,
    AllocationLookup,
    LedgerAck,
    ModelSpec,
    PlacementRequest,
    ReleaseRequest,
    ReplicaAllocation,
    ReplicaInput,
    ReplicaState,
    Route,
)
from workflows.names import (
    ControlActivity,
    artifact_fetch_workflow_id,
    node_task_queue,
    replica_id,
    replica_workflow_id,
)
from workflows.replica.workflow import ReplicaWorkflow

WAITING = 300
NODES = 3
# Far fewer than the waiting replicas: the old design would have filled every one.
CONTROL_SLOTS = 20


@dataclass
class StandInLedger:
    """Placement and routes as the replicas see them, answered at once."""

    nodes: list[str]
    routes: dict[str, Route] = field(default_factory=dict)
    allocations: dict[str, Allocation] = field(default_factory=dict)
    placed: int = 0

    @activity.defn(name=ControlActivity.LEDGER_ALLOCATION)
    async def allocation(self, req: AllocationLookup) -> ReplicaAllocation:
        # A replica starting asks first whether it holds one already (a run after a terminate).
        return ReplicaAllocation(allocation=self.allocations.get(req.replica_id))

    @activity.defn(name=ControlActivity.LEDGER_PLACE)
    async def place(self, req: PlacementRequest) -> Allocation:
        held = self.allocations.get(req.replica_id)
        if held is not None:
            return held
        node = self.nodes[self.placed % len(self.nodes)]
        self.placed += 1
        alloc = self.allocations[req.replica_id] = Allocation(
            replica_id=req.replica_id,
            workflow_id=req.workflow_id,
            model=req.model,
            node=node,
            address="127.0.0.1",
            port=20000 + self.placed,
            cpu_cores=1,
            memory_mb=1024,
        )
        return alloc

    @activity.defn(name=ControlActivity.LEDGER_SET_ROUTE)
    async def set_route(self, route: Route) -> LedgerAck:
        self.routes[route.replica_id] = route
        return LedgerAck(version=len(self.routes))

    @activity.defn(name=ControlActivity.LEDGER_RELEASE)
    async def release(self, req: ReleaseRequest) -> LedgerAck:
        return LedgerAck(version=len(self.routes))

    def state(self, rid: str) -> ReplicaState | None:
        route = self.routes.get(rid)
        return route.state if route is not None else None


@dataclass
class Fleet:
    client: Client
    queue: str
    ledger: StandInLedger
    agents: list[FakeAgent]
    started: list[WorkflowHandle[Any, Any]] = field(default_factory=list)

    async def start(self, model: ModelSpec, index: int) -> str:
        rid = replica_id(model.name, index)
        handle = await self.client.start_workflow(
            ReplicaWorkflow.run,
            ReplicaInput(replica_id=rid, model=model),
            id=replica_workflow_id(model.name, index),
            task_queue=self.queue,
        )
        self.started.append(handle)
        return rid

    async def waiting(self) -> int:
        """Replicas registered with a node's fetch and not yet told its end."""
        count = 0
        for agent in self.agents:
            fetch_id = artifact_fetch_workflow_id(agent.node, ARTIFACT)
            with contextlib.suppress(RPCError):  # not started yet
                fetch = self.client.get_workflow_handle(fetch_id)
                count += len(await fetch.query(ArtifactFetchWorkflow.waiting))
        return count


@pytest.fixture
async def fleet(env: WorkflowEnvironment) -> AsyncIterator[Fleet]:
    agents = [FakeAgent(unique(f"n{i}")) for i in range(NODES)]
    for agent in agents:
        agent.fetch_gate = asyncio.Event()  # downloads that take as long as the test wants
    ledger = StandInLedger([agent.node for agent in agents])
    queue = unique("control")
    control = Worker(
        env.client,
        task_queue=queue,
        workflows=CONTROL_WORKFLOWS,
        activities=[
            ledger.allocation,
            ledger.place,
            ledger.set_route,
            ledger.release,
            *ArtifactFetchActivities(control_client(env)).all(),
        ],
        max_concurrent_activities=CONTROL_SLOTS,
    )
    on_nodes = [
        Worker(env.client, task_queue=node_task_queue(agent.node), activities=agent.all())
        for agent in agents
    ]
    await ensure_search_attributes(env.client)
    async with control:
        for worker in on_nodes:
            await worker.__aenter__()
        made = Fleet(env.client, queue, ledger, agents)
        try:
            yield made
        finally:
            ids = [h.id for h in made.started]
            ids += [artifact_fetch_workflow_id(a.node, ARTIFACT) for a in agents]
            for workflow_id in ids:
                with contextlib.suppress(RPCError):  # already closed
                    await env.client.get_workflow_handle(workflow_id).terminate("test over")
            for worker in on_nodes:
                await worker.__aexit__(None, None, None)


async def test_300_replicas_waiting_for_weights_leave_the_control_queue_free(fleet: Fleet) -> None:
    waiting_model = artifact_spec()
    waiting = [await fleet.start(waiting_model, i) for i in range(WAITING)]

    async def all_waiting() -> bool:
        """every replica registered with its node's fetch"""
        return await fleet.waiting() == WAITING

    await eventually(all_waiting, timeout=240)
    assert all(fleet.ledger.state(rid) == ReplicaState.STARTING for rid in waiting)

    # A replica with nothing to fetch: placed, routed, started and ready while 300 wait.
    newcomer = await fleet.start(artifact_spec().model_copy(update={"artifact": ""}), 0)

    async def newcomer_ready() -> bool:
        """the newcomer is ready while every fetch is still held back"""
        return fleet.ledger.state(newcomer) == ReplicaState.READY

    await eventually(newcomer_ready, timeout=30)
    assert await fleet.waiting() == WAITING, "nobody stopped waiting to make room"
    assert all(agent.launches == [newcomer] or not agent.launches for agent in fleet.agents)

    for agent in fleet.agents:
        assert agent.fetch_gate is not None  # the fixture gave each agent one
        agent.fetch_gate.set()

    async def all_ready() -> bool:
        """every waiting replica started once its node's fetch was done"""
        return all(fleet.ledger.state(rid) == ReplicaState.READY for rid in waiting)

    await eventually(all_ready, timeout=240)
    # One download per node, however many replicas waited on it.
    assert [agent.fetches for agent in fleet.agents] == [[ARTIFACT]] * NODES
    assert sum(len(agent.launches) for agent in fleet.agents) == WAITING + 1
