"""What operators and faults do to a node: join with an identity, wait for an expected node,
cordon, drain, remove, lose it; and the schedules' refresh and onboarding."""

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.exceptions import TemporalError
from temporalio.service import RPCError
from temporalio.worker import Worker

from activities.control.node_admin import add_node
from tests.workflows.conftest import Cluster, eventually, finished, record_history, unique
from tests.workflows.fake_agent import FakeAgent
from tests.workflows.test_node import (
    ledger_record,
    node_handle,
    register,
    registration,
    wait_for_node,
)
from tests.workflows.test_replica import run_histories
from workflows import history_budget
from workflows.contracts import (
    Allocation,
    EngineState,
    EngineStatus,
    ModelSpec,
    ModelState,
    NodeAdd,
    NodeCommand,
    NodeInventory,
    NodeNames,
    NodeRecord,
    NodeRefresh,
    NodeState,
    NodeView,
    PlacementRefusal,
    PlacementRequest,
    Profile,
    ReplicaState,
    Route,
)
from workflows.fleet import SIGNAL_BATCH, FleetRefreshWorkflow, ScheduledOnboardingWorkflow
from workflows.model.workflow import ModelWorkflow
from workflows.names import model_workflow_id, node_task_queue, replica_id
from workflows.node.workflow import NodeWorkflow


async def upsert_ready_node(cluster: Cluster, name: str) -> None:
    """A node in the fleet tables only (no node workflow): it never goes lost on its own."""
    record = NodeRecord(
        inventory=NodeInventory(name=name, cpu_cores=8, memory_mb=16384),
        state=NodeState.READY,
        engines={
            "llamacpp": EngineStatus(
                engine="llamacpp", version="1", state=EngineState.INSTALLED, path="/x"
            )
        },
    )
    await cluster.fleet.upsert_node(record)


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
            await cluster.fleet.upsert_node(record)


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


async def test_the_first_identity_is_pinned_and_another_token_is_refused(cluster: Cluster) -> None:
    await register(cluster, cluster.node, registration(cluster.node, identity="token-a"))
    await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)

    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await node_handle(cluster).execute_update(
            NodeWorkflow.register, registration(cluster.node, boot_id="boot-2", identity="token-b")
        )
    assert "joined with another token" in str(refused.value.cause)

    # The same token after an agent restart is this node coming back.
    view = await register(
        cluster, cluster.node, registration(cluster.node, boot_id="boot-2", identity="token-a")
    )
    assert view.boot_id == "boot-2"


async def test_no_agent_can_register_as_the_node_external_models_routes_name(
    cluster: Cluster,
) -> None:
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await register(cluster, "external", registration("external"))
    assert "reserved for external models' routes" in str(refused.value.cause)
    assert "external" not in (await cluster.ledger()).nodes


async def test_a_live_node_name_cannot_be_taken_by_another_machine(cluster: Cluster) -> None:
    first = registration(cluster.node)
    first.inventory.machine_id, first.inventory.hostname = "aaaa", "rack1-07"
    cluster.agent.inventory = first.inventory  # what its agent's watch sees too
    await register(cluster, cluster.node, first)
    await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)

    clone = registration(cluster.node, boot_id="boot-9")
    clone.inventory.machine_id = "bbbb"
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await node_handle(cluster).execute_update(NodeWorkflow.register, clone)
    assert "live on another machine (rack1-07)" in str(refused.value.cause)


async def test_an_expected_node_waits_with_its_labels_until_its_agent_registers(
    cluster: Cluster,
) -> None:
    labels = {"rack": "r1", "tier": "a"}
    await add_node(cluster.client, NodeAdd(name=cluster.node, labels=labels), cluster.task_queue)
    cluster.started.append(node_handle(cluster))

    async def awaiting() -> bool:
        record = await ledger_record(cluster)
        return record is not None and record.state == NodeState.AWAITING

    await eventually(awaiting)
    refused = await cluster.place(placement())
    assert isinstance(refused, PlacementRefusal)
    assert f"{cluster.node}: node is awaiting" in refused.summary

    await register(
        cluster, cluster.node, registration(cluster.node, labels={"tier": "b", "gpu": "none"})
    )
    record = await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)
    # The operator's labels win over the agent's own.
    assert record.labels == {"rack": "r1", "tier": "a", "gpu": "none"}


async def test_cordon_keeps_new_replicas_away_until_uncordon(cluster: Cluster) -> None:
    await register(cluster, cluster.node, registration(cluster.node))
    await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)
    handle = node_handle(cluster)

    await handle.signal(NodeWorkflow.cordon, NodeCommand(reason="disk swap"))

    async def cordoned() -> bool:
        record = await ledger_record(cluster)
        return record is not None and record.cordoned

    await eventually(cordoned)
    refused = await cluster.place(placement())
    assert isinstance(refused, PlacementRefusal)
    assert f"{cluster.node}: node is cordoned (disk swap)" in refused.summary

    await handle.signal(NodeWorkflow.uncordon, NodeCommand())

    async def uncordoned() -> bool:
        return not await cordoned()

    await eventually(uncordoned)
    allocation = await cluster.place(placement())
    assert isinstance(allocation, Allocation)
    assert allocation.node == cluster.node
    assert await cluster.fleet.release(allocation.replica_id)


async def test_drain_moves_each_replica_after_its_successor_serves(cluster: Cluster) -> None:
    await register(cluster, cluster.node, registration(cluster.node))
    await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)
    model = await serving_model(cluster)
    old, successor = replica_id(model, 0), replica_id(model, 1)

    async with second_node(cluster) as other:
        await node_handle(cluster).signal(NodeWorkflow.drain, NodeCommand(reason="kernel update"))
        await wait_route(cluster, successor, ReplicaState.READY, other.node)
        await released(cluster, old)
        # The old engine was stopped on its node, after draining its requests.
        assert old in cluster.agent.stops

        async def drained() -> bool:
            record = await ledger_record(cluster)
            return record is not None and not record.draining and record.note == "drained"

        await eventually(drained, timeout=30)
        record = await ledger_record(cluster)
        assert record is not None
        assert record.cordoned
        assert record.state == NodeState.READY
    await record_history(node_handle(cluster), "NodeDrained")


async def served_route(cluster: Cluster, rid: str) -> Route | None:
    """The replica's route as gateways read it (the tables' routing table), not as stored."""
    table = await cluster.fleet.routing_table()
    return next((r for r in table.routes if r.replica_id == rid), None)


async def test_an_unreachable_node_keeps_its_replicas_and_serves_again_when_heard(
    cluster: Cluster,
) -> None:
    await register(cluster, cluster.node, registration(cluster.node, lost_after_s=3))
    await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)
    model = await serving_model(cluster)
    rid = replica_id(model, 0)
    launches = len(cluster.agent.launches)

    async with second_node(cluster):
        # No heartbeats: the node is cut off. Gateways send it requests only as a last resort
        # from now on (tests/unit/test_gateway_routing.py)...
        cluster.agent.silent = True
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
        cluster.agent.silent = False
        await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)

        async def serving() -> bool:
            route = await served_route(cluster, rid)
            return route is not None and not route.node_unreachable

        await eventually(serving)
        assert len(cluster.agent.launches) == launches
        assert cluster.agent.stops == []
        assert replica_id(model, 1) not in (await cluster.ledger()).allocations


async def test_a_lost_nodes_replicas_are_placed_elsewhere(cluster: Cluster) -> None:
    # A short grace: time cannot be skipped while the replica's supervise activity runs.
    reg = registration(cluster.node, lost_after_s=3, gone_after_s=5)
    await register(cluster, cluster.node, reg)
    await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)
    model = await serving_model(cluster)
    old, successor = replica_id(model, 0), replica_id(model, 1)

    async with second_node(cluster) as other:
        # No heartbeats from here on.
        cluster.agent.silent = True
        await wait_for_node(cluster, NodeState.LOST, EngineState.INSTALLED)
        await wait_route(cluster, successor, ReplicaState.READY, other.node)
        await released(cluster, old)
    await record_history(node_handle(cluster), "NodeLost")


async def test_remove_takes_the_node_out_and_moves_its_replicas(cluster: Cluster) -> None:
    await register(cluster, cluster.node, registration(cluster.node))
    await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)
    model = await serving_model(cluster)
    successor = replica_id(model, 1)

    async with second_node(cluster) as other:
        await node_handle(cluster).signal(NodeWorkflow.remove, NodeCommand(reason="decommissioned"))
        view = await finished(cluster.client, node_handle(cluster).id, NodeView)
        assert view is not None
        assert view.record.state == NodeState.REMOVED
        assert cluster.node not in (await cluster.ledger()).nodes
        await wait_route(cluster, successor, ReplicaState.READY, other.node)
        await released(cluster, replica_id(model, 0))


async def test_the_refresh_schedule_publishes_a_changed_machine_and_a_broken_engine(
    cluster: Cluster,
) -> None:
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
    # Nodes in the tables without a workflow are skipped, not fatal.
    assert cluster.node in told.names

    record = await wait_for_node(cluster, NodeState.READY, EngineState.FAILED)
    assert record.inventory.memory_mb == 32768
    assert record.engines["llamacpp"].detail == "ldd: libgomp.so.1 => not found"
    assert (cluster.agent.discoveries, cluster.agent.verifications) == (1, 1)
    refused = await cluster.place(placement())
    assert isinstance(refused, PlacementRefusal)
    assert f"{cluster.node}: llamacpp failed: ldd: libgomp.so.1" in refused.summary


async def test_scheduled_onboarding_expects_every_node_in_the_file(
    cluster: Cluster, server_config: Path
) -> None:
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
        assert (await finished(cluster.client, run.id, NodeNames)).names == names
        await record_history(run, "ScheduledOnboarding")
    finally:
        server_config.write_text("")
    state = await cluster.ledger()
    assert [state.nodes[n].state for n in names] == [NodeState.AWAITING] * 2
    assert state.nodes[names[0]].labels == {"rack": "r2"}
    assert state.nodes[names[0]].inventory.address == "10.0.0.5"
    for name in names:
        await cluster.client.get_workflow_handle(f"node:{name}").signal(
            NodeWorkflow.remove, NodeCommand()
        )


async def test_onboarding_a_long_list_continues_as_new_and_adds_every_node(
    cluster: Cluster, server_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # More nodes than one batch, and a history budget a batch exceeds: the run must continue
    # as new with the nodes still to add, as it would at 10,000 nodes.
    names = [unique("many") for _ in range(SIGNAL_BATCH + 20)]
    nodes_file = server_config.parent / "many-nodes.yaml"
    nodes_file.write_text("nodes:\n" + "".join(f"  - {{name: {n}}}\n" for n in names))
    server_config.write_text(f"nodes_file: {nodes_file}\n")
    monkeypatch.setattr(history_budget, "FORCE_EVERY_EVENTS", 20)
    try:
        run = await cluster.start(ScheduledOnboardingWorkflow.run, id=unique("fleet-onboarding"))
        assert (await finished(cluster.client, run.id, NodeNames)).names == names
        histories = await run_histories(cluster.client, run.id)
        await record_history(run, "ScheduledOnboardingContinued")

        async def all_awaiting() -> bool:
            # Each node's workflow enters itself in the tables after it starts: a moment after
            # the onboarding run returns.
            nodes = (await cluster.ledger()).nodes
            return all(n in nodes and nodes[n].state == NodeState.AWAITING for n in names)

        await eventually(all_awaiting, timeout=60)
    finally:
        server_config.write_text("")
        for name in names:
            with contextlib.suppress(RPCError):  # a workflow that never started
                handle = cluster.client.get_workflow_handle(f"node:{name}")
                await handle.signal(NodeWorkflow.remove, NodeCommand())
    assert len(histories) == 2, "did not continue as new after a batch"


async def test_a_broken_nodes_file_fails_the_run_naming_the_field(
    cluster: Cluster, server_config: Path
) -> None:
    nodes_file = server_config.parent / "bad-nodes.yaml"
    nodes_file.write_text("nodes:\n  - {name: ok-1, labels: [not, a, map]}\n")
    server_config.write_text(f"nodes_file: {nodes_file}\n")
    try:
        run = await cluster.start(ScheduledOnboardingWorkflow.run, id=unique("fleet-onboarding"))
        with pytest.raises(WorkflowFailureError) as failed:
            await run.result()
    finally:
        server_config.write_text("")
    # The run failed on an activity's error: a Temporal failure, whose cause names the field.
    assert "labels" in str(cast(TemporalError, failed.value.cause).cause)


async def test_an_engine_disabled_at_add_is_kept_off_and_comes_back_when_enabled(
    cluster: Cluster,
) -> None:
    """`llmgw node add --disable-engine` before the node joins, and `--enable-engine` after."""
    expect = NodeAdd(name=cluster.node, disable_engines=["llamacpp"])
    view = await add_node(cluster.client, expect, cluster.task_queue)
    assert view.disabled_engines == ["llamacpp"]
    cluster.started.append(node_handle(cluster))
    await register(cluster, cluster.node, registration(cluster.node))
    record = await wait_for_node(cluster, NodeState.READY, EngineState.UNAVAILABLE)
    assert record.engines["llamacpp"].detail == (
        "disabled for this node (`llmgw node add --disable-engine`)"
    )
    assert cluster.agent.installs == []
    refused = await cluster.place(placement())
    assert isinstance(refused, PlacementRefusal)

    # An add that says nothing of engines (the scheduled onboarding's) keeps it off.
    await add_node(cluster.client, NodeAdd(name=cluster.node), cluster.task_queue)
    enable = NodeAdd(name=cluster.node, enable_engines=["llamacpp"])
    view = await add_node(cluster.client, enable, cluster.task_queue)
    assert view.disabled_engines == []
    await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)
    assert [i.requirement.engine for i in cluster.agent.installs] == ["llamacpp"]
    assert isinstance(await cluster.place(placement()), Allocation)
    await record_history(node_handle(cluster), "NodeEngineDisabledThenEnabled")


async def test_an_add_naming_an_unknown_engine_is_refused(cluster: Cluster) -> None:
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await add_node(
            cluster.client, NodeAdd(name=cluster.node, disable_engines=["vlm"]), cluster.task_queue
        )
    assert "no engine named vlm to disable or enable" in str(refused.value.cause)
    cluster.started.append(node_handle(cluster))
