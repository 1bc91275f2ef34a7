"""What the catalog does to running replicas: a bad definition is refused with the field named,
a changed profile rolls the fleet one replica at a time, and an autoscaled model follows its
engines' load down to zero and back up when a request wakes it."""

import asyncio
from typing import Any

import pytest
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError

from tests.workflows.conftest import (
    Cluster,
    ask,
    eventually,
    finished,
    record_history,
    unique,
)
from tests.workflows.test_model import serving, track_replicas
from workflows.contracts import (
    Autoscale,
    EngineLoad,
    ModelSpec,
    ModelState,
    ModelView,
    ModelWake,
    Profile,
    RemoveModel,
)
from workflows.model.client import apply_model
from workflows.model.workflow import ModelWorkflow
from workflows.names import model_workflow_id, replica_id


def cpu_spec(replicas: int = 1, **fields: Any) -> ModelSpec:
    profile = Profile(engine="llamacpp", cpu_cores=1, memory_mb=256, context_size=2048)
    return ModelSpec(
        name=unique("m"), weights="/w/model.gguf", replicas=replicas, profiles=[profile], **fields
    )


async def start(cluster: Cluster, model: ModelSpec) -> WorkflowHandle[ModelWorkflow, ModelView]:
    track_replicas(cluster, model, count=8)
    return await cluster.start(
        ModelWorkflow.run, ModelState(spec=model), id=model_workflow_id(model.name)
    )


async def remove(cluster: Cluster, handle: WorkflowHandle[ModelWorkflow, ModelView]) -> None:
    """End the model the way an operator does, so its replicas stop and release (a terminated
    replica would leave its supervise activity in flight, and the test server would then stop
    skipping time for the tests after it)."""
    await handle.execute_update(ModelWorkflow.remove, RemoveModel())
    await finished(cluster.client, handle.id)


async def test_a_definition_llmgw_cannot_run_is_refused_naming_the_field(cluster: Cluster) -> None:
    model = cpu_spec(replicas=0)
    handle = await start(cluster, model)
    bad = model.model_copy(deep=True)
    bad.profiles = [
        Profile(engine="vllm", gpu_class="a100-80g", gpus_per_node=2, tensor_parallel=4),
        Profile(engine="llamacpp", env={"LD_PRELOAD": "/tmp/x.so"}, memory_mb=512),
    ]
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(ModelWorkflow.apply, bad)
    message = str(refused.value.cause)
    assert "profiles[0].tensor_parallel x pipeline_parallel" in message
    assert "profiles[1].env.LD_PRELOAD" in message
    view = await ask(handle, ModelWorkflow.describe)
    assert view.spec == model  # nothing of the bad definition was taken


async def test_a_changed_profile_replaces_replicas_one_at_a_time(cluster: Cluster) -> None:
    await cluster.add_node(cores=16)
    model = cpu_spec(replicas=2)
    handle = await start(cluster, model)
    first = [replica_id(model.name, 0), replica_id(model.name, 1)]

    async def both_serving() -> bool:
        return await serving(cluster, model) == first

    await eventually(both_serving)

    changed = model.model_copy(deep=True)
    changed.profiles[0].context_size = 4096
    await apply_model(cluster.client, changed, cluster.task_queue)

    async def rolled() -> bool:
        view = await handle.query(ModelWorkflow.describe)
        names = await serving(cluster, model)
        return not view.stale and len(names) == 2 and not set(names) & set(first)

    await eventually(rolled, timeout=90)
    # Each old replica was replaced once and stopped once its successor served.
    # The first two start concurrently, so their launch order is not fixed.
    started = [r for r in cluster.agent.launches if r.startswith(model.name)]
    assert sorted(started[:2]) == first
    assert len(started) == 4

    async def old_stopped() -> bool:
        return set(first) <= set(cluster.agent.stops)

    await eventually(old_stopped, timeout=30)
    await remove(cluster, handle)


async def test_an_idle_autoscaled_model_goes_to_zero_and_a_request_wakes_it(
    cluster: Cluster,
) -> None:
    await cluster.add_node(cores=16)
    policy = Autoscale(idle_s=2, look_every_s=1, quiet_s=1, sustained_s=0, queue_per_replica=1)
    model = cpu_spec(replicas=1, min_replicas=0, max_replicas=3, autoscale=policy)
    handle = await start(cluster, model)

    async def replicas(n: int) -> bool:
        view = await handle.query(ModelWorkflow.describe)
        return view.spec.replicas == n and len(await serving(cluster, model)) == n

    # Generous bounds: with continue-as-new forced every few events (the second pass of make
    # test) each step crosses several runs, and a loaded machine slows each of them.
    await eventually(lambda: replicas(1), timeout=60)
    # Queued requests on the one replica: the model grows, a replica a look (sustained_s=0)
    # while the queue lasts, so a slow check may first see 3 (max_replicas), not 2.
    first = replica_id(model.name, 0)
    cluster.agent.loads[first] = EngineLoad(replica_id=first, running=2, waiting=6, work=10)

    async def grew() -> bool:
        view = await handle.query(ModelWorkflow.describe)
        return view.spec.replicas >= 2 and len(await serving(cluster, model)) == view.spec.replicas

    await eventually(grew, timeout=60)

    # Then nothing at all: down to zero, and the gateways are told it can be woken.
    cluster.agent.loads.clear()

    async def idle() -> bool:
        return model.name in (await cluster.ledger()).idle_models

    await eventually(lambda: replicas(0), timeout=60)
    await eventually(idle, timeout=60)

    # The woken replica is busy from its first look. Idle, it would go back to zero 2 s after
    # it serves (idle_s=2: that is right), which on the time-skipping server, under load, can
    # pass between two checks and leave none to see it serve.
    for index in range(32):
        woken = replica_id(model.name, index)
        cluster.agent.loads[woken] = EngineLoad(replica_id=woken, running=1, waiting=0, work=1)
    await handle.signal(ModelWorkflow.wake, ModelWake())
    await eventually(lambda: replicas(1), timeout=60)
    assert model.name not in (await cluster.ledger()).idle_models
    await remove(cluster, handle)


async def test_a_removal_that_arrives_while_the_autoscaler_looks_is_not_undone(
    cluster: Cluster,
) -> None:
    """The autoscaler asks the engines' load (an activity); a removal that lands meanwhile must
    not be overwritten by the count the autoscaler read before it asked, or the model keeps a
    replica and never closes."""
    await cluster.add_node(cores=16)
    policy = Autoscale(idle_s=3600, look_every_s=1, quiet_s=1, sustained_s=0, queue_per_replica=1)
    model = cpu_spec(replicas=1, min_replicas=0, max_replicas=3, autoscale=policy)
    handle = await start(cluster, model)

    async def one_serves() -> bool:
        return len(await serving(cluster, model)) == 1

    await eventually(one_serves, timeout=60)
    cluster.agent.load_gate = asyncio.Event()
    cluster.agent.load_asked.clear()

    async def looking() -> bool:
        return cluster.agent.load_asked.is_set()

    await eventually(looking, timeout=60)
    await handle.execute_update(ModelWorkflow.remove, RemoveModel())
    cluster.agent.load_gate.set()
    await finished(cluster.client, handle.id)
    assert await serving(cluster, model) == []
    await record_history(handle, "ModelRemovedWhileAutoscalerLooked")
