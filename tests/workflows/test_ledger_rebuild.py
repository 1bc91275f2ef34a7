"""A closed ledger is never replaced by an empty one: ledger calls fail loudly until `llmgw
ledger rebuild` starts it again from the node and replica workflows.

On a dev server of its own (the time-skipping test server cannot list workflows, which the
rebuild does), so terminating the ledger here leaves the session's ledger alone."""

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from activities.control.ledger_calls import LEDGER_CLOSED
from activities.control.ledger_cluster import allocate
from tests.workflows.conftest import eventually, start_dev_server, unique
from tests.workflows.fake_agent import FakeAgent
from workers.agent import register
from workers.control import control_activities, ensure_ledger
from workers.ledger_commands import (
    LedgerRunning,
    ledger_problem,
    rebuild_ledger,
    set_ledger_cells,
)
from workers.progress import ledger_snapshot
from workers.registry import CONTROL_WORKFLOWS
from workers.search_attributes import ensure_search_attributes
from workflows.contracts import (
    AllocationLookup,
    EngineState,
    ModelSpec,
    ModelState,
    NodeInventory,
    NodeRegistration,
    NodeState,
    PlacementRequest,
    Profile,
    ReplicaState,
)
from workflows.engine_plan import LLAMACPP_DEFAULT_VERSION
from workflows.ledger import ClusterLedgerWorkflow
from workflows.ledger_cells import cell_of_node
from workflows.model import ModelWorkflow
from workflows.names import (
    CONTROL_TASK_QUEUE,
    LEDGER_WORKFLOW_ID,
    ledger_cell_workflow_id,
    model_workflow_id,
    node_task_queue,
    replica_id,
)


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Client]:
    env = await start_dev_server()
    config = tmp_path / "llmgw.yaml"
    config.write_text("")
    try:
        await ensure_search_attributes(env.client)
        async with Worker(
            env.client,
            task_queue=CONTROL_TASK_QUEUE,
            workflows=CONTROL_WORKFLOWS,
            activities=control_activities(env.client, config),
        ):
            await ensure_ledger(env.client)
            yield env.client
    finally:
        await env.shutdown()


async def ledger_status(client: Client, ledger: str) -> WorkflowExecutionStatus | None:
    return (await client.get_workflow_handle(ledger).describe()).status


def cells_for(node: str, split: bool) -> int:
    """One cell, or the fewest cells that put `node` in a cell of its own, not `cluster`."""
    return next(k for k in range(2, 64) if cell_of_node(node, k) != 0) if split else 1


@pytest.mark.parametrize("split", [False, True], ids=["one ledger", "ledger in cells"])
async def test_a_terminated_ledger_fails_loudly_and_is_rebuilt_from_nodes_and_replicas(
    client, split
):
    node = unique("n")
    agent = FakeAgent(node)
    cells = cells_for(node, split)
    if split:
        await set_ledger_cells(client, cells)
    # The ledger workflow that holds this node: `cluster`, or its cell's.
    ledger = ledger_cell_workflow_id(cell_of_node(node, cells))
    async with Worker(client, task_queue=node_task_queue(node), activities=agent.all()):
        reg = NodeRegistration(
            inventory=NodeInventory(name=node, cpu_cores=8, memory_mb=16384), boot_id="b1"
        )
        await register(client, reg)

        async def node_ready() -> bool:
            record = (await ledger_snapshot(client)).nodes.get(node)
            return (
                record is not None
                and record.state == NodeState.READY
                and record.engines["llamacpp"].state == EngineState.INSTALLED
            )

        await eventually(node_ready, timeout=30)
        model = ModelSpec(
            name=unique("m"),
            weights="/w/model.gguf",
            replicas=1,
            engine_version=LLAMACPP_DEFAULT_VERSION,
        )
        await client.start_workflow(
            ModelWorkflow.run,
            ModelState(spec=model),
            id=model_workflow_id(model.name),
            task_queue=CONTROL_TASK_QUEUE,
        )
        r0 = replica_id(model.name, 0)

        async def serving() -> bool:
            route = (await ledger_snapshot(client)).routes.get(r0)
            return route is not None and route.state == ReplicaState.READY

        await eventually(serving, timeout=30)
        before = await ledger_snapshot(client)
        assert await ledger_problem(client) is None

        if split:
            # The node, its allocation and its route are in its cell, not in `cluster`.
            assert ledger != LEDGER_WORKFLOW_ID
            held = await client.get_workflow_handle(ledger).query(
                ClusterLedgerWorkflow.holds, AllocationLookup(replica_id=r0)
            )
            assert (held.allocation, held.route) == (True, True)
            assert await ledger_problem(client) is None

        # An operator terminates the ledger in the Temporal UI.
        await client.get_workflow_handle(ledger).terminate("operator")
        request = PlacementRequest(
            replica_id=unique("other"), model="other", profiles=[Profile(cpu_cores=1)]
        )
        with pytest.raises(ApplicationError) as refused:
            await allocate(client, request)
        assert refused.value.type == LEDGER_CLOSED
        assert "llmgw ledger rebuild" in refused.value.message
        # Nor does a restarting control worker start an empty ledger in its place.
        await ensure_ledger(client)
        assert await ledger_status(client, ledger) == WorkflowExecutionStatus.TERMINATED
        problem = await ledger_problem(client) or ""
        assert "llmgw ledger rebuild" in problem
        assert ledger in problem

        await rebuild_ledger(client)
        assert await ledger_status(client, ledger) == WorkflowExecutionStatus.RUNNING
        assert await ledger_problem(client) is None
        rebuilt = await ledger_snapshot(client)
        assert rebuilt.nodes[node].state == NodeState.READY
        assert rebuilt.allocations[r0] == before.allocations[r0]
        route = rebuilt.routes[r0]
        assert (route.state, route.endpoint, route.node) == (
            ReplicaState.READY,
            before.routes[r0].endpoint,
            node,
        )
        assert route.engine == before.routes[r0].engine
        # Placement counts the rebuilt allocation: the replica's port is not handed out again.
        placed = await allocate(client, request)
        assert placed.node == node
        assert placed.port != rebuilt.allocations[r0].port
        with pytest.raises(LedgerRunning):
            await rebuild_ledger(client)
