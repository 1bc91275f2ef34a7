"""The node workflow: registration installs engines, silence makes a node lost, its agent
heard again brings it back, and a failed install keeps replicas away with the install's own
words."""

import asyncio

import pytest
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError

from tests.workflows.conftest import (
    Cluster,
    ask,
    eventually,
    record_history,
    unique,
)
from workers.agent import register as agent_register
from workflows.contracts import (
    EngineState,
    EngineStatus,
    NodeInventory,
    NodeRecord,
    NodeRefresh,
    NodeRegistration,
    NodeState,
    NodeView,
    PlacementRefusal,
    PlacementRequest,
    Profile,
)
from workflows.engine_install import EngineInstallWorkflow
from workflows.engine_plan import LLAMACPP_DEFAULT_VERSION
from workflows.names import (
    engine_install_workflow_id,
    node_workflow_id,
)
from workflows.node.workflow import NodeWorkflow

# The llama.cpp version the default engine plan installs.
V = LLAMACPP_DEFAULT_VERSION


def registration(name: str, boot_id: str = "boot-1", **fields: object) -> NodeRegistration:
    return NodeRegistration(
        inventory=NodeInventory(name=name, cpu_cores=8, memory_mb=16384),
        boot_id=boot_id,
        **fields,
    )


async def register(cluster: Cluster, node: str, reg: NodeRegistration) -> NodeView:
    """What the agent does at boot: start the node workflow if missing, then register."""
    view = await agent_register(cluster.client, reg)
    cluster.started.append(cluster.client.get_workflow_handle(node_workflow_id(node)))
    return view


async def ledger_record(cluster: Cluster) -> NodeRecord | None:
    return (await cluster.ledger()).nodes.get(cluster.node)


async def wait_for_node(cluster: Cluster, state: NodeState, engine: EngineState) -> NodeRecord:
    async def there() -> bool:
        record = await ledger_record(cluster)
        llamacpp = record.engines.get("llamacpp") if record else None
        return (
            record is not None
            and record.state == state
            and llamacpp is not None
            and llamacpp.state == engine
        )

    await eventually(there)
    record = await ledger_record(cluster)
    assert record is not None
    return record


def node_handle(cluster: Cluster) -> WorkflowHandle[NodeWorkflow, NodeView | None]:
    return cluster.client.get_workflow_handle_for(NodeWorkflow.run, node_workflow_id(cluster.node))


async def test_registration_installs_engines_and_the_node_becomes_ready(cluster: Cluster) -> None:
    view = await register(cluster, cluster.node, registration(cluster.node))
    assert view.record.inventory.name == cluster.node
    assert view.record.state == NodeState.READY

    record = await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)
    llamacpp = record.engines["llamacpp"]
    assert (llamacpp.version, llamacpp.path) == (V, "/engines/llama-server")
    assert record.inventory.cpu_cores == 8
    assert [(i.node, i.requirement.engine) for i in cluster.agent.installs] == [
        (cluster.node, "llamacpp")
    ]
    described = await ask(node_handle(cluster), NodeWorkflow.describe)
    assert described.boot_id == "boot-1"
    assert described.record.engines["llamacpp"].state == EngineState.INSTALLED

    install: WorkflowHandle[EngineInstallWorkflow, EngineStatus] = (
        cluster.client.get_workflow_handle_for(
            EngineInstallWorkflow.run, engine_install_workflow_id(cluster.node, "llamacpp", V)
        )
    )
    assert (await install.result()).state == EngineState.INSTALLED
    await record_history(install, "EngineInstall")


async def test_a_node_cannot_register_under_another_nodes_name(cluster: Cluster) -> None:
    await register(cluster, cluster.node, registration(cluster.node))
    await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)
    impostor = unique("impostor")

    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await node_handle(cluster).execute_update(
            NodeWorkflow.register, registration(impostor, boot_id="boot-x")
        )
    assert f"cannot register as {cluster.node!r}" in str(refused.value.cause)
    described = await ask(node_handle(cluster), NodeWorkflow.describe)
    assert described.record.inventory.name == cluster.node
    assert described.boot_id == "boot-1"
    assert impostor not in (await cluster.ledger()).nodes


async def test_a_silent_node_is_unreachable_then_lost_and_its_agent_brings_it_back(
    cluster: Cluster,
) -> None:
    # A short grace in real time: the time-skipping server proved unreliable at skipping here
    # once earlier tests had run replicas (the RPC timed out).
    reg = registration(cluster.node, lost_after_s=3, gone_after_s=6)
    await register(cluster, cluster.node, reg)
    await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)
    handle = node_handle(cluster)

    # The agent's liveness watch keeps it ready. A sleep on purpose: 5 s of real time past the
    # 3 s grace, so that only the watch's heartbeats can be what kept it ready.
    beats = cluster.agent.beats
    await asyncio.sleep(5)
    assert cluster.agent.beats > beats
    heard = await ledger_record(cluster)
    assert heard is not None
    assert heard.state == NodeState.READY

    # Silent past the grace: unreachable first, and its agent heard again makes it ready.
    cluster.agent.silent = True
    record = await wait_for_node(cluster, NodeState.UNREACHABLE, EngineState.INSTALLED)
    assert record.note.startswith("no heartbeat for")
    cluster.agent.silent = False
    await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)

    # Silent past the gone grace: lost.
    cluster.agent.silent = True
    record = await wait_for_node(cluster, NodeState.LOST, EngineState.INSTALLED)
    assert record.engines["llamacpp"].state == EngineState.INSTALLED  # only liveness changed
    assert record.note.startswith("no heartbeat for")
    assert (await ask(handle, NodeWorkflow.describe)).record.state == NodeState.LOST

    cluster.agent.silent = False
    await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)
    await record_history(handle, "NodeWatchUnreachableLostBack")


async def test_an_agent_that_dies_during_reverification_still_loses_its_node(
    cluster: Cluster,
) -> None:
    reg = registration(cluster.node, lost_after_s=3, gone_after_s=5)
    await register(cluster, cluster.node, reg)
    await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)
    # The scheduled re-verification reaches the agent, which then dies: no answer, no heartbeat.
    cluster.agent.verification_hangs = True
    cluster.agent.silent = True
    await node_handle(cluster).signal(NodeWorkflow.refresh, NodeRefresh(engines=True))
    record = await wait_for_node(cluster, NodeState.LOST, EngineState.INSTALLED)
    assert record.note.startswith("no heartbeat for")
    assert cluster.agent.verifications == 1, "it was asked and never answered"
    await record_history(node_handle(cluster), "NodeSilentDuringVerification")


async def test_a_failed_install_is_reported_and_placement_refuses_the_node(
    cluster: Cluster,
) -> None:
    cluster.agent.install_result = EngineState.FAILED
    cluster.agent.install_detail = "cmake: no C++ compiler found"
    await register(cluster, cluster.node, registration(cluster.node))

    record = await wait_for_node(cluster, NodeState.READY, EngineState.FAILED)
    assert record.engines["llamacpp"] == EngineStatus(
        engine="llamacpp",
        version=V,
        state=EngineState.FAILED,
        detail="cmake: no C++ compiler found",
    )

    request = PlacementRequest(
        replica_id=unique("m") + "-0",
        model="m",
        profiles=[Profile(engine_version=V, cpu_cores=1, memory_mb=64)],
    )
    refused = await cluster.place(request)
    assert isinstance(refused, PlacementRefusal)
    assert f"{cluster.node}: llamacpp failed: cmake: no C++ compiler found" in refused.summary
