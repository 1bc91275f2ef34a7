"""The model workflow: replicas follow the declared count, and removal leaves nothing behind."""

import pytest
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError

from tests.workflows.conftest import Cluster, ask, eventually, finished, record_history, unique
from workflows.contracts import (
    ModelSpec,
    ModelState,
    ModelView,
    RemoveModel,
    ReplicaState,
    ReplicaView,
    ScaleRequest,
)
from workflows.model.client import apply_model
from workflows.model.workflow import ModelWorkflow
from workflows.names import model_workflow_id, replica_id, replica_workflow_id
from workflows.replica.workflow import ReplicaWorkflow


def spec(replicas: int) -> ModelSpec:
    return ModelSpec(
        name=unique("m"), weights="/w/model.gguf", replicas=replicas, engine_version="1"
    )


def track_replicas(cluster: Cluster, model: ModelSpec, count: int = 4) -> None:
    """Replicas are abandoned by a terminated model workflow: have the fixture end them too if
    the test fails before removing the model."""
    for index in range(count):
        handle = cluster.client.get_workflow_handle(replica_workflow_id(model.name, index))
        cluster.started.append(handle)


async def serving(cluster: Cluster, model: ModelSpec) -> list[str]:
    """The replicas of this model the gateway would route to, by replica id."""
    routes = (await cluster.ledger()).routes.values()
    return sorted(
        r.replica_id for r in routes if r.model == model.name and r.state == ReplicaState.READY
    )


async def held_by(cluster: Cluster, model: ModelSpec) -> tuple[list[str], list[str]]:
    """Allocations and routes (any state) the ledger still has for this model."""
    state = await cluster.ledger()
    prefix = f"{model.name}-"
    allocations = sorted(r for r in state.allocations if r.startswith(prefix))
    routes = sorted(r for r in state.routes if r.startswith(prefix))
    return allocations, routes


async def test_model_scales_down_newest_first_and_removal_releases_everything(
    cluster: Cluster,
) -> None:
    await cluster.add_node(cores=8)
    model = spec(replicas=2)
    track_replicas(cluster, model)
    handle = await cluster.start(
        ModelWorkflow.run, ModelState(spec=model), id=model_workflow_id(model.name)
    )
    r0, r1 = replica_id(model.name, 0), replica_id(model.name, 1)

    async def both_ready() -> bool:
        return await serving(cluster, model) == [r0, r1]

    await eventually(both_ready)
    view = await ask(handle, ModelWorkflow.describe)
    assert view.replica_ids == [r0, r1]
    allocations = (await cluster.ledger()).allocations
    assert allocations[r0].port != allocations[r1].port

    # The update answers once the new count is accepted; the replicas follow it.
    view = await handle.execute_update(ModelWorkflow.scale, ScaleRequest(replicas=1))
    assert view.spec.replicas == 1

    async def newest_gone() -> bool:
        return await held_by(cluster, model) == ([r0], [r0])

    await eventually(newest_gone)
    assert (await ask(handle, ModelWorkflow.describe)).replica_ids == [r0]
    assert await serving(cluster, model) == [r0]
    assert cluster.agent.stops == [r1]
    assert cluster.agent.running() == [r0]
    replica1: WorkflowHandle[ReplicaWorkflow, ReplicaView] = cluster.client.get_workflow_handle_for(
        ReplicaWorkflow.run, replica_workflow_id(model.name, 1)
    )
    stopped = await finished(cluster.client, replica1.id, ReplicaView)
    assert stopped.state == ReplicaState.STOPPED

    other = model.model_copy(update={"name": unique("other")})
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(ModelWorkflow.apply, other)
    assert f"not {other.name!r}" in str(refused.value.cause)
    assert (await ask(handle, ModelWorkflow.describe)).spec.name == model.name

    view = await handle.execute_update(ModelWorkflow.remove, RemoveModel())
    assert view.removing
    result = await finished(cluster.client, handle.id, ModelView)
    assert result.removing
    assert result.spec.replicas == 0
    # The workflow ends only once its replicas have stopped their engines and released.
    assert await held_by(cluster, model) == ([], [])
    assert sorted(cluster.agent.stops) == [r0, r1]
    assert cluster.agent.running() == []

    await record_history(handle, "Model")
    await record_history(
        cluster.client.get_workflow_handle(replica_workflow_id(model.name, 0)), "Replica"
    )


async def test_apply_creates_a_missing_model_then_updates_it_as_the_cli_does(
    cluster: Cluster,
) -> None:
    await cluster.add_node(cores=8)
    model = spec(replicas=1)
    track_replicas(cluster, model)

    async def apply(declared: ModelSpec) -> ModelView:
        # What `llmgw model add` calls.
        view = await apply_model(cluster.client, declared, cluster.task_queue)
        cluster.started.append(cluster.client.get_workflow_handle(model_workflow_id(declared.name)))
        return view

    view = await apply(model)
    assert view.spec == model
    r0, r1 = replica_id(model.name, 0), replica_id(model.name, 1)

    async def one_ready() -> bool:
        return await serving(cluster, model) == [r0]

    await eventually(one_ready)

    # The same call again, now with two replicas: the running workflow takes the new spec.
    view = await apply(model.model_copy(update={"replicas": 2}))
    assert view.spec.replicas == 2

    async def two_ready() -> bool:
        return await serving(cluster, model) == [r0, r1]

    await eventually(two_ready)
    assert sorted(cluster.agent.launches) == [r0, r1]  # replica 0 was not restarted

    handle = cluster.client.get_workflow_handle(model_workflow_id(model.name))
    await handle.execute_update(ModelWorkflow.remove, RemoveModel())
    await finished(cluster.client, handle.id)
    assert await held_by(cluster, model) == ([], [])
