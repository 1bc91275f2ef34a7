"""Terminate, Cancel and Reset from the Temporal UI or CLI on a model's, a replica's and a node's
workflows: no engine stops, no allocation leaks or doubles, and the workflows come back by
themselves. What each test checks is what a user would see: the same engine (the stand-in
agent's pid) serving, no second launch, the route ready all along, the allocation unchanged."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from temporalio import activity
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.worker import Worker

from tests.workflows.conftest import (
    Cluster,
    ask,
    eventually,
    record_history,
    unique,
)
from tests.workflows.fake_agent import FakeAgent
from tests.workflows.test_model import held_by, serving, spec, track_replicas
from tests.workflows.test_node import registration
from workers.agent import register as agent_register
from workflows.contracts import (
    Allocation,
    EngineInstallRequest,
    EngineState,
    EngineStatus,
    ModelSpec,
    ModelState,
    NodeCommand,
    NodeState,
    ReplicaState,
    ScaleRequest,
)
from workflows.engine_plan import LLAMACPP_DEFAULT_VERSION
from workflows.model.client import apply_model
from workflows.model.workflow import ModelWorkflow
from workflows.names import (
    NodeActivity,
    engine_install_workflow_id,
    model_workflow_id,
    node_task_queue,
    node_workflow_id,
    replica_id,
    replica_workflow_id,
)
from workflows.node.workflow import NodeWorkflow
from workflows.replica.workflow import ReplicaWorkflow

# How often a model looks at its replica workflows (options.REPLICA_CHECK_EVERY), in seconds;
# read when a model's run starts.
CHECK_EVERY = "LLMGW_TEST_REPLICA_CHECK_EVERY_S"


async def status(client: Client, workflow_id: str) -> WorkflowExecutionStatus | None:
    return (await client.get_workflow_handle(workflow_id).describe()).status


async def run_id(client: Client, workflow_id: str) -> str | None:
    return (await client.get_workflow_handle(workflow_id).describe()).run_id


async def allocations(cluster: Cluster, model: ModelSpec) -> dict[str, Allocation]:
    state = await cluster.ledger()
    return {r: a for r, a in state.allocations.items() if r.startswith(f"{model.name}-")}


async def replica_ready(client: Client, workflow_id: str) -> bool:
    """The replica's workflow (its latest run) runs and sees its engine ready."""
    handle = client.get_workflow_handle(workflow_id)
    if (await handle.describe()).status != WorkflowExecutionStatus.RUNNING:
        return False
    return (await handle.query(ReplicaWorkflow.describe)).state == ReplicaState.READY


async def cancel_handled(client: Client, workflow_id: str) -> None:
    """Wait until the workflow has taken a cancel request: a workflow task completed after it."""

    async def taken() -> bool:
        events = (await client.get_workflow_handle(workflow_id).fetch_history()).events
        asked = [
            i
            for i, e in enumerate(events)
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED
        ]
        done = [
            i
            for i, e in enumerate(events)
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
        ]
        return bool(asked) and bool(done) and done[-1] > asked[0]

    await eventually(taken)


@asynccontextmanager
async def route_watch(cluster: Cluster, rid: str) -> AsyncIterator[list[ReplicaState | None]]:
    """Every state the replica's route showed gateways while the block ran, polled."""
    seen: list[ReplicaState | None] = []
    stop = asyncio.Event()

    async def poll() -> None:
        while not stop.is_set():
            route = await cluster.route(rid)
            state = route.state if route is not None else None
            if not seen or seen[-1] != state:
                seen.append(state)
            await asyncio.sleep(0.05)

    task = asyncio.ensure_future(poll())
    try:
        yield seen
    finally:
        stop.set()
        await task


async def serving_model(
    cluster: Cluster, replicas: int, monkeypatch: pytest.MonkeyPatch
) -> ModelSpec:
    """A model of `replicas` replicas, every one serving, that checks its replicas every second."""
    await cluster.add_node(cores=8)
    monkeypatch.setenv(CHECK_EVERY, "1")
    model = spec(replicas=replicas)
    track_replicas(cluster, model)
    await cluster.start(ModelWorkflow.run, ModelState(spec=model), id=model_workflow_id(model.name))
    wanted = [replica_id(model.name, i) for i in range(replicas)]

    async def all_serving() -> bool:
        return await serving(cluster, model) == wanted

    await eventually(all_serving)
    return model


async def test_a_terminated_replica_comes_back_and_adopts_its_engine(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = await serving_model(cluster, 1, monkeypatch)
    r0, workflow_id = replica_id(model.name, 0), replica_workflow_id(model.name, 0)
    pid = cluster.agent.engines[r0].pid
    before = await allocations(cluster, model)
    first_run = await run_id(cluster.client, workflow_id)

    async with route_watch(cluster, r0) as seen:
        await cluster.client.get_workflow_handle(workflow_id).terminate("operator (test)")

        async def back() -> bool:
            again = await run_id(cluster.client, workflow_id)
            return again != first_run and await replica_ready(cluster.client, workflow_id)

        await eventually(back)

    # The same engine serves, nothing was launched or stopped, and gateways were never told
    # the replica was anything but ready.
    assert cluster.agent.engines[r0].pid == pid
    assert cluster.agent.launches == [r0]
    assert cluster.agent.stops == []
    assert seen == [ReplicaState.READY]
    assert await allocations(cluster, model) == before
    assert await serving(cluster, model) == [r0]
    view = await ask(
        cluster.client.get_workflow_handle(model_workflow_id(model.name)), ModelWorkflow.describe
    )
    assert view.replica_ids == [r0]
    await record_history(
        cluster.client.get_workflow_handle(workflow_id), "ReplicaAdoptsAfterTerminate"
    )
    await record_history(
        cluster.client.get_workflow_handle(model_workflow_id(model.name)),
        "ModelRestartsTerminatedReplica",
    )


async def test_a_cancelled_replica_or_model_refuses_and_keeps_serving(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = await serving_model(cluster, 1, monkeypatch)
    r0 = replica_id(model.name, 0)
    replica_wf, model_wf = replica_workflow_id(model.name, 0), model_workflow_id(model.name)
    runs = (await run_id(cluster.client, replica_wf), await run_id(cluster.client, model_wf))

    async with route_watch(cluster, r0) as seen:
        await cluster.client.get_workflow_handle(replica_wf).cancel()
        await cluster.client.get_workflow_handle(model_wf).cancel()
        await cancel_handled(cluster.client, replica_wf)
        await cancel_handled(cluster.client, model_wf)

    for workflow_id in (replica_wf, model_wf):
        assert await status(cluster.client, workflow_id) == WorkflowExecutionStatus.RUNNING
    assert (
        await run_id(cluster.client, replica_wf),
        await run_id(cluster.client, model_wf),
    ) == runs
    assert seen == [ReplicaState.READY]
    assert cluster.agent.launches == [r0]
    assert cluster.agent.stops == []
    # Both still do their work: the model scales, the new replica serves beside the first.
    model_handle = cluster.client.get_workflow_handle(model_wf)
    await model_handle.execute_update(ModelWorkflow.scale, ScaleRequest(replicas=2))
    r1 = replica_id(model.name, 1)

    async def both() -> bool:
        return await serving(cluster, model) == [r0, r1]

    await eventually(both)
    await record_history(cluster.client.get_workflow_handle(replica_wf), "ReplicaRefusesCancel")
    await record_history(model_handle, "ModelRefusesCancel")


async def test_a_model_applied_again_after_terminate_adopts_its_replicas(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = await serving_model(cluster, 2, monkeypatch)
    r0, r1 = replica_id(model.name, 0), replica_id(model.name, 1)
    pids = {r: cluster.agent.engines[r].pid for r in (r0, r1)}
    before = await allocations(cluster, model)
    # The model's workflow and one of its replicas' are terminated; the other replica runs on.
    await cluster.client.get_workflow_handle(model_workflow_id(model.name)).terminate("operator")
    await cluster.client.get_workflow_handle(replica_workflow_id(model.name, 1)).terminate("op")
    assert await serving(cluster, model) == [r0, r1]  # nothing told the gateways otherwise

    await apply_model(cluster.client, model, task_queue=cluster.task_queue)
    handle = cluster.client.get_workflow_handle(model_workflow_id(model.name))
    cluster.started.append(handle)

    async def settled() -> bool:
        return await replica_ready(cluster.client, replica_workflow_id(model.name, 1))

    await eventually(settled)
    # No second copy: the same two engines, no index 2, the same allocations.
    assert {r: cluster.agent.engines[r].pid for r in (r0, r1)} == pids
    assert sorted(cluster.agent.launches) == sorted([r0, r1])  # each once; they start together
    assert cluster.agent.stops == []
    assert await allocations(cluster, model) == before
    assert await held_by(cluster, model) == ([r0, r1], [r0, r1])
    assert (await ask(handle, ModelWorkflow.describe)).replica_ids == [r0, r1]
    await record_history(handle, "ModelAdoptsAfterTerminate")


async def reset_to_first_task(client: Client, workflow_id: str) -> str:
    """`temporal workflow reset --type FirstWorkflowTask`: the new run's id."""
    handle = client.get_workflow_handle(workflow_id)
    events = (await handle.fetch_history()).events
    first = next(
        e.event_id for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    )
    described = await handle.describe()
    answer = await client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=workflow_id, run_id=described.run_id),
            reason="operator (test)",
            workflow_task_finish_event_id=first,
            request_id=unique("reset"),
        )
    )
    return answer.run_id


async def test_a_replica_reset_to_its_start_adopts_its_engine(
    dev_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On a dev server: the time-skipping test server does not implement reset.
    cluster = dev_cluster
    model = await serving_model(cluster, 1, monkeypatch)
    r0, workflow_id = replica_id(model.name, 0), replica_workflow_id(model.name, 0)
    pid = cluster.agent.engines[r0].pid
    before = await allocations(cluster, model)

    async with route_watch(cluster, r0) as seen:
        new_run = await reset_to_first_task(cluster.client, workflow_id)

        async def serving_again() -> bool:
            again = await run_id(cluster.client, workflow_id)
            return again == new_run and await replica_ready(cluster.client, workflow_id)

        await eventually(serving_again)

    assert cluster.agent.engines[r0].pid == pid
    assert cluster.agent.launches == [r0]
    assert seen == [ReplicaState.READY]
    assert await allocations(cluster, model) == before


class GatedInstallAgent(FakeAgent):
    """An agent whose first install takes until the test lets it finish."""

    def __init__(self, node: str) -> None:
        super().__init__(node)
        self.let_install = asyncio.Event()

    @activity.defn(name=NodeActivity.INSTALL_ENGINE)
    async def install(self, req: EngineInstallRequest) -> EngineStatus:
        if not self.installs:
            self.installs.append(req)
            await self.let_install.wait()
            self.installs.pop()
        return await super().install(req)


async def test_a_node_refuses_cancel_and_restarts_a_terminated_install(
    dev_cluster: Cluster,
) -> None:
    # On a dev server: the time-skipping test server never tells a parent its child was
    # terminated.
    cluster = dev_cluster
    agent = GatedInstallAgent(unique("gated"))
    node_wf = node_workflow_id(agent.node)
    install_wf = engine_install_workflow_id(agent.node, "llamacpp", LLAMACPP_DEFAULT_VERSION)
    async with Worker(
        cluster.client, task_queue=node_task_queue(agent.node), activities=agent.all()
    ):
        await agent_register(cluster.client, registration(agent.node), cluster.task_queue)
        handle = cluster.client.get_workflow_handle(node_wf)
        cluster.started.append(handle)

        async def installing() -> bool:
            return bool(agent.installs)

        await eventually(installing)
        # Cancel the node mid-install: refused, the install goes on.
        await handle.cancel()
        await cancel_handled(cluster.client, node_wf)
        assert await status(cluster.client, install_wf) == WorkflowExecutionStatus.RUNNING
        # Terminate the install: the node starts it again.
        first_install = await run_id(cluster.client, install_wf)
        await cluster.client.get_workflow_handle(install_wf).terminate("operator (test)")

        async def installed() -> bool:
            record = (await cluster.ledger()).nodes.get(agent.node)
            engine = record.engines.get("llamacpp") if record else None
            return engine is not None and engine.state == EngineState.INSTALLED

        await eventually(installed)
        assert await run_id(cluster.client, install_wf) != first_install
        assert await status(cluster.client, node_wf) == WorkflowExecutionStatus.RUNNING
        # The node still takes commands after both.
        await handle.signal(NodeWorkflow.cordon, NodeCommand(reason="after cancel (test)"))

        async def cordoned() -> bool:
            record = (await cluster.ledger()).nodes.get(agent.node)
            return record is not None and record.cordoned and record.state == NodeState.READY

        await eventually(cordoned)
        agent.let_install.set()
        await record_history(handle, "NodeRefusesCancelRestartsInstall")
        # Out of placement for the tests after this one: nobody serves its queue then.
        record = (await cluster.ledger()).nodes[agent.node]
        await cluster.fleet.upsert_node(record.model_copy(update={"state": NodeState.LOST}))
