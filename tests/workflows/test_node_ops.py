"""What operators and faults do to a node: join with an identity, wait for an expected node,
cordon, drain, remove, lose it; and the schedules' refresh and onboarding."""

import contextlib
from collections.abc import AsyncIterator

import pytest
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from activities.ledger_calls import update_ledger
from activities.node_admin import add_node
from tests.workflows.conftest import Cluster, eventually, record_history, unique
from tests.workflows.fake_agent import FakeAgent
from tests.workflows.test_node import (
    ledger_record,
    node_handle,
    register,
    registration,
    wait_for_node,
)
from workflows.contracts import (
    Allocation,
    EngineState,
    EngineStatus,
    LedgerAck,
    ModelSpec,
    ModelState,
    NodeAdd,
    NodeCommand,
    NodeHeartbeat,
    NodeInventory,
    NodeRecord,
    NodeRefresh,
    NodeState,
    PlacementRequest,
    Profile,
    ReleaseRequest,
    ReplicaState,
    Route,
    RoutingTable,
    RoutingTableRequest,
)
from workflows.fleet import FleetRefreshWorkflow, ScheduledOnboardingWorkflow
from workflows.model import ModelWorkflow
from workflows.names import LEDGER_WORKFLOW_ID, model_workflow_id, node_task_queue, replica_id


async def upsert_ready_node(cluster: Cluster, name: str) -> None:
    """A node known to the ledger only (no node workflow): it never goes lost on its own."""
    record = NodeRecord(
        inventory=NodeInventory(name=name, cpu_cores=8, memory_mb=16384),
        state=NodeState.READY,
        engines={
            "llamacpp": EngineStatus(
                engine="llamacpp", version="1", state=EngineState.INSTALLED, path="/x"
            )
        },
    )
    await update_ledger(cluster.client, "upsert_node", record, LedgerAck)


@contextlib.asynccontextmanager
async def second_node(cluster: Cluster) -> AsyncIterator[FakeAgent]:
    """Another node with its own stand-in agent, taken out of placement afterwards."""
    agent = FakeAgent(unique("n2"))
    async with Worker(
        cluster.client, task_queue=node_task_queue(agent.node), activities=agent.all()
    ):
        await upsert_ready_node(cluster, agent.node)
        try:
            yield agent
        finally:
            state = await cluster.ledger()
            record = state.nodes[agent.node]
            record.state = NodeState.LOST
            await update_ledger(cluster.client, "upsert_node", record, LedgerAck)


async def serving_model(cluster: Cluster) -> str:
    """A one-replica model, serving on the test's registered node."""
    model = unique("m")
    spec = ModelSpec(name=model, weights="/w.gguf", replicas=1, cpu_cores=1, memory_mb=64)
    await cluster.start(ModelWorkflow.run, ModelState(spec=spec), id=model_workflow_id(model))
    await wait_route(cluster, replica_id(model, 0), ReplicaState.READY, cluster.node)
    return model


async def wait_route(cluster: Cluster, rid: str, state: ReplicaState, node: str) -> None:
    async def there() -> bool:
        route = await cluster.route(rid)
        return route is not None and route.state == state and route.node == node

    there.__doc__ = f"{rid} {state.value} on {node}"
    await eventually(there, timeout=30)


async def released(cluster: Cluster, rid: str) -> None:
    async def gone() -> bool:
        state = await cluster.ledger()
        return rid not in state.routes and rid not in state.allocations

    gone.__doc__ = f"{rid} released"
    await eventually(gone, timeout=30)


def placement(model: str = "m") -> PlacementRequest:
    return PlacementRequest(
        replica_id=unique(model) + "-0",
        model=model,
        profiles=[Profile(engine_version="", cpu_cores=1, memory_mb=64)],
    )


async def test_the_first_identity_is_pinned_and_another_token_is_refused(cluster):
    await register(cluster, cluster.node, registration(cluster.node, identity="token-a"))
    await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)

    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await node_handle(cluster).execute_update(
            "register", registration(cluster.node, boot_id="boot-2", identity="token-b")
        )
    assert "joined with another token" in str(refused.value.cause)

    # The same token after an agent restart is this node coming back.
    view = await register(
        cluster, cluster.node, registration(cluster.node, boot_id="boot-2", identity="token-a")
    )
    assert view.boot_id == "boot-2"


async def test_no_agent_can_register_as_the_node_external_models_routes_name(cluster):
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await register(cluster, "external", registration("external"))
    assert "reserved for external models' routes" in str(refused.value.cause)
    assert "external" not in (await cluster.ledger()).nodes


async def test_a_live_node_name_cannot_be_taken_by_another_machine(cluster):
    first = registration(cluster.node)
    first.inventory.machine_id, first.inventory.hostname = "aaaa", "rack1-07"
    await register(cluster, cluster.node, first)
    await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)

    clone = registration(cluster.node, boot_id="boot-9")
    clone.inventory.machine_id = "bbbb"
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await node_handle(cluster).execute_update("register", clone)
    assert "live on another machine (rack1-07)" in str(refused.value.cause)


async def test_an_expected_node_waits_with_its_labels_until_its_agent_registers(cluster):
    await add_node(cluster.client, NodeAdd(name=cluster.node, labels={"rack": "r1", "tier": "a"}))
    cluster.started.append(node_handle(cluster))

    async def awaiting() -> bool:
        record = await ledger_record(cluster)
        return record is not None and record.state == NodeState.AWAITING

    await eventually(awaiting)
    with pytest.raises(ApplicationError) as refused:
        await update_ledger(cluster.client, "place", placement(), Allocation)
    assert f"{cluster.node}: node is awaiting" in refused.value.message

    await register(
        cluster, cluster.node, registration(cluster.node, labels={"tier": "b", "gpu": "none"})
    )
    record = await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)
    # The operator's labels win over the agent's own.
    assert record.labels == {"rack": "r1", "tier": "a", "gpu": "none"}


async def test_cordon_keeps_new_replicas_away_until_uncordon(cluster):
    await register(cluster, cluster.node, registration(cluster.node))
    await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)
    handle = node_handle(cluster)

    await handle.signal("cordon", NodeCommand(reason="disk swap"))

    async def cordoned() -> bool:
        record = await ledger_record(cluster)
        return record is not None and record.cordoned

    await eventually(cordoned)
    with pytest.raises(ApplicationError) as refused:
        await update_ledger(cluster.client, "place", placement(), Allocation)
    assert f"{cluster.node}: node is cordoned (disk swap)" in refused.value.message

    await handle.signal("uncordon", NodeCommand())

    async def uncordoned() -> bool:
        return not await cordoned()

    await eventually(uncordoned)
    allocation = await update_ledger(cluster.client, "place", placement(), Allocation)
    assert allocation.node == cluster.node
    release = ReleaseRequest(replica_id=allocation.replica_id)
    await update_ledger(cluster.client, "release", release, LedgerAck)


async def test_drain_moves_each_replica_after_its_successor_serves(cluster):
    await register(cluster, cluster.node, registration(cluster.node))
    await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)
    model = await serving_model(cluster)
    old, successor = replica_id(model, 0), replica_id(model, 1)

    async with second_node(cluster) as other:
        await node_handle(cluster).signal("drain", NodeCommand(reason="kernel update"))
        await wait_route(cluster, successor, ReplicaState.READY, other.node)
        await released(cluster, old)
        # The old engine was stopped on its node, after draining its requests.
        assert old in cluster.agent.stops

        async def drained() -> bool:
            record = await ledger_record(cluster)
            return record is not None and not record.draining and record.note == "drained"

        await eventually(drained, timeout=30)
        record = await ledger_record(cluster)
        assert record.cordoned and record.state == NodeState.READY
    await record_history(node_handle(cluster), "NodeDrained")


async def served_route(cluster: Cluster, rid: str) -> Route | None:
    """The replica's route as gateways read it (the routing-table query), not as stored."""
    table = await cluster.client.get_workflow_handle(LEDGER_WORKFLOW_ID).query(
        "routing_table", RoutingTableRequest(), result_type=RoutingTable
    )
    return next((r for r in table.routes if r.replica_id == rid), None)


async def test_an_unreachable_node_keeps_its_replicas_and_serves_again_when_heard(cluster):
    await register(cluster, cluster.node, registration(cluster.node, lost_after_s=3))
    await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)
    model = await serving_model(cluster)
    rid = replica_id(model, 0)
    launches = len(cluster.agent.launches)

    async with second_node(cluster):
        # No heartbeats: the node is cut off. Gateways send it requests only as a last resort
        # from now on (tests/unit/test_gateway_routing.py)...
        await wait_for_node(cluster, NodeState.UNREACHABLE, EngineState.INSTALLED)

        async def withdrawn() -> bool:
            route = await served_route(cluster, rid)
            return route is not None and route.node_unreachable

        await eventually(withdrawn)
        # ...but nothing moves: its engine keeps its allocation, and no successor starts.
        state = await cluster.ledger()
        assert rid in state.allocations
        assert replica_id(model, 1) not in state.allocations

        # The partition heals: the same replica serves again, with nothing restarted.
        await node_handle(cluster).signal("heartbeat", NodeHeartbeat(boot_id="boot-1"))
        await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)

        async def serving() -> bool:
            route = await served_route(cluster, rid)
            return route is not None and not route.node_unreachable

        await eventually(serving)
        assert len(cluster.agent.launches) == launches
        assert cluster.agent.stops == []
        assert replica_id(model, 1) not in (await cluster.ledger()).allocations


async def test_a_lost_nodes_replicas_are_placed_elsewhere(cluster):
    # A short grace: time cannot be skipped while the replica's supervise activity runs.
    reg = registration(cluster.node, lost_after_s=3, gone_after_s=5)
    await register(cluster, cluster.node, reg)
    await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)
    model = await serving_model(cluster)
    old, successor = replica_id(model, 0), replica_id(model, 1)

    async with second_node(cluster) as other:
        # No heartbeats from here on.
        await wait_for_node(cluster, NodeState.LOST, EngineState.INSTALLED)
        await wait_route(cluster, successor, ReplicaState.READY, other.node)
        await released(cluster, old)
    await record_history(node_handle(cluster), "NodeLost")


async def test_remove_takes_the_node_out_and_moves_its_replicas(cluster):
    await register(cluster, cluster.node, registration(cluster.node))
    await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)
    model = await serving_model(cluster)
    successor = replica_id(model, 1)

    async with second_node(cluster) as other:
        await node_handle(cluster).signal("remove", NodeCommand(reason="decommissioned"))
        view = await node_handle(cluster).result()
        assert view is not None and view.record.state == NodeState.REMOVED
        assert cluster.node not in (await cluster.ledger()).nodes
        await wait_route(cluster, successor, ReplicaState.READY, other.node)
        await released(cluster, replica_id(model, 0))


async def test_the_refresh_schedule_publishes_a_changed_machine_and_a_broken_engine(cluster):
    await register(cluster, cluster.node, registration(cluster.node))
    await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)
    cluster.agent.inventory = NodeInventory(name=cluster.node, cpu_cores=8, memory_mb=32768)
    cluster.agent.broken["llamacpp"] = "ldd: libgomp.so.1 => not found"

    run = await cluster.start(
        FleetRefreshWorkflow.run,
        NodeRefresh(inventory=True, engines=True),
        id=unique("fleet-refresh"),
    )
    told = await run.result()
    await record_history(run, "FleetRefresh")
    # Nodes known to the ledger without a workflow are skipped, not fatal.
    assert cluster.node in told.names

    record = await wait_for_node(cluster, NodeState.READY, EngineState.FAILED)
    assert record.inventory.memory_mb == 32768
    assert record.engines["llamacpp"].detail == "ldd: libgomp.so.1 => not found"
    assert (cluster.agent.discoveries, cluster.agent.verifications) == (1, 1)
    with pytest.raises(ApplicationError) as refused:
        await update_ledger(cluster.client, "place", placement(), Allocation)
    assert f"{cluster.node}: llamacpp failed: ldd: libgomp.so.1" in refused.value.message


async def test_scheduled_onboarding_expects_every_node_in_the_file(cluster, server_config):
    names = [unique("listed"), unique("listed")]
    nodes_file = server_config.parent / "nodes.yaml"
    nodes_file.write_text(
        "nodes:\n"
        f"  - {{name: {names[0]}, address: 10.0.0.5, labels: {{rack: r2}}}}\n"
        f"  - {{name: {names[1]}}}\n"
    )
    server_config.write_text(f"nodes_file: {nodes_file}\n")
    try:
        run = await cluster.start(ScheduledOnboardingWorkflow.run, id=unique("fleet-onboarding"))
        assert (await run.result()).names == names
        await record_history(run, "ScheduledOnboarding")
    finally:
        server_config.write_text("")
    state = await cluster.ledger()
    assert [state.nodes[n].state for n in names] == [NodeState.AWAITING] * 2
    assert state.nodes[names[0]].labels == {"rack": "r2"}
    assert state.nodes[names[0]].inventory.address == "10.0.0.5"
    for name in names:
        await cluster.client.get_workflow_handle(f"node:{name}").signal("remove", NodeCommand())


async def test_a_broken_nodes_file_fails_the_run_naming_the_field(cluster, server_config):
    nodes_file = server_config.parent / "bad-nodes.yaml"
    nodes_file.write_text("nodes:\n  - {name: ok-1, labels: [not, a, map]}\n")
    server_config.write_text(f"nodes_file: {nodes_file}\n")
    try:
        run = await cluster.start(ScheduledOnboardingWorkflow.run, id=unique("fleet-onboarding"))
        with pytest.raises(WorkflowFailureError) as failed:
            await run.result()
    finally:
        server_config.write_text("")
    assert "labels" in str(failed.value.cause.cause)
