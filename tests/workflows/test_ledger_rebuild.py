"""`llmgw ledger check` and `llmgw ledger rebuild` (workers/commands/ledger.py): the fleet
tables, corrupted or wiped while node and replica workflows run, are found to differ from the
workflows, line by line, and rebuilt from them until nothing differs.

On a dev server of its own: the time-skipping test server cannot list workflows, which the
check and the rebuild do; and with fleet tables of its own, so wiping them here leaves the
other tests' alone."""

import argparse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from activities.control.fleet_activities import FleetActivities
from store.fleet import FleetTables, open_fleet
from tests.workflows.conftest import eventually, start_dev_server, unique
from tests.workflows.fake_agent import FakeAgent
from workers.agent import register
from workers.commands.ledger import drift, ledger_command, rebuilt_state
from workers.control import control_activities
from workers.registry import CONTROL_WORKFLOWS
from workers.search_attributes import ensure_search_attributes
from workflows.contracts import (
    Allocation,
    EngineState,
    ModelSpec,
    ModelState,
    NodeInventory,
    NodeRegistration,
    NodeState,
    PlacementRequest,
    Profile,
    ReplicaState,
    Route,
)
from workflows.engine_plan import LLAMACPP_DEFAULT_VERSION
from workflows.model.workflow import ModelWorkflow
from workflows.names import CONTROL_TASK_QUEUE, model_workflow_id, node_task_queue, replica_id


@dataclass
class ControlPlane:
    client: Client
    fleet: FleetTables


@pytest.fixture
async def plane(tmp_path: Path) -> AsyncIterator[ControlPlane]:
    env = await start_dev_server()
    config = tmp_path / "llmgw.yaml"
    config.write_text("")
    fleet = open_fleet(None, tmp_path / "fleet")
    try:
        await fleet.init()
        await ensure_search_attributes(env.client)
        async with Worker(
            env.client,
            task_queue=CONTROL_TASK_QUEUE,
            workflows=CONTROL_WORKFLOWS,
            activities=control_activities(env.client, fleet, config),
        ):
            yield ControlPlane(env.client, fleet)
    finally:
        await fleet.close()
        await env.shutdown()


async def check(plane: ControlPlane, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """`llmgw ledger check`: the lines it prints when the tables differ (it exits 1 then),
    and none when they agree with the workflows."""
    args = argparse.Namespace(ledger_command="check")
    code: object = 0
    try:
        await ledger_command(args, plane.client, plane.fleet)
    except SystemExit as exit_:
        code = exit_.code
    lines = capsys.readouterr().out.splitlines()
    if code == 0:
        assert lines == ["the fleet tables agree with the workflows"]
        return []
    assert code == 1
    assert lines, "exit 1 with no difference printed"
    return lines


async def rebuild(plane: ControlPlane, capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(ledger_command="rebuild")
    await ledger_command(args, plane.client, plane.fleet)
    assert capsys.readouterr().out.startswith("wrote the fleet tables from the workflows")


async def test_corrupted_or_wiped_tables_are_found_and_rebuilt_from_the_workflows(
    plane: ControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    client, fleet = plane.client, plane.fleet
    node = unique("n")
    agent = FakeAgent(node)
    async with Worker(client, task_queue=node_task_queue(node), activities=agent.all()):
        reg = NodeRegistration(
            inventory=NodeInventory(name=node, cpu_cores=8, memory_mb=16384), boot_id="b1"
        )
        await register(client, reg)

        async def node_ready() -> bool:
            record = (await fleet.snapshot()).nodes.get(node)
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
            route = (await fleet.snapshot()).routes.get(r0)
            return route is not None and route.state == ReplicaState.READY

        await eventually(serving, timeout=30)
        before = await fleet.snapshot()
        assert drift(await rebuilt_state(client), before) == []
        assert await check(plane, capsys) == []

        # Corrupted: the replica's allocation lost (a restore from an older backup, say), a
        # route no replica publishes, and a model marked idle that no workflow scaled to zero.
        async with fleet.db.transaction() as tx:
            await tx.execute("DELETE FROM fleet_claims WHERE replica_id = ?", r0)
            await tx.execute("DELETE FROM fleet_allocations WHERE replica_id = ?", r0)
        ghost = Route(
            replica_id="ghost-0",
            model="ghost",
            node=node,
            endpoint="http://10.9.9.9:1",
            engine="llamacpp",
            state=ReplicaState.READY,
        )
        assert await fleet.set_route(ghost)
        assert await fleet.set_idle("ghost", True)
        assert await check(plane, capsys) == [
            f"allocation {r0}: its replica holds it, the tables do not",
            "route ghost-0: in the tables only",
            "idle models: [] in the workflows, ['ghost'] held",
        ]

        await rebuild(plane, capsys)
        assert await check(plane, capsys) == []
        rebuilt = await fleet.snapshot()
        assert rebuilt.allocations == before.allocations
        assert rebuilt.idle_models == []
        # Gateways see the replica and no longer the ghost.
        served = {r.replica_id: r for r in (await fleet.routing_table()).routes}
        assert "ghost-0" not in served
        route = served[r0]
        assert (route.state, route.endpoint, route.node, route.engine) == (
            ReplicaState.READY,
            before.routes[r0].endpoint,
            node,
            before.routes[r0].engine,
        )
        # Placement counts the rebuilt allocation: the replica's port is not handed out again.
        request = PlacementRequest(
            replica_id=unique("other") + "-0", model="other", profiles=[Profile(cpu_cores=1)]
        )
        placed = await FleetActivities(fleet).place(request)
        assert isinstance(placed, Allocation)
        assert placed.node == node
        assert placed.port != rebuilt.allocations[r0].port
        assert await fleet.release(placed.replica_id)

        # Wiped: every node, allocation and route gone.
        async with fleet.db.transaction() as tx:
            for table in ("fleet_claims", "fleet_allocations", "fleet_routes", "fleet_nodes"):
                await tx.execute(f"DELETE FROM {table}")
        assert await check(plane, capsys) == [
            f"node {node}: its workflow runs, the tables do not list it",
            f"allocation {r0}: its replica holds it, the tables do not",
            f"route {r0}: in its workflow only",
        ]
        await rebuild(plane, capsys)
        assert await check(plane, capsys) == []
        restored = await fleet.snapshot()
        assert restored.nodes[node].state == NodeState.READY
        assert restored.allocations == before.allocations
        assert restored.routes[r0].endpoint == before.routes[r0].endpoint
