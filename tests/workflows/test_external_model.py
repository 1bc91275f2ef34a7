"""An external model: servers llmgw does not run, one ready route per URL and nothing placed."""

import pytest
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from tests.workflows.conftest import Cluster, ask, eventually, finished, record_history, unique
from tests.workflows.test_model import serving, track_replicas
from workflows.contracts import (
    ExternalKv,
    KvEventSource,
    KvSource,
    ModelSpec,
    ModelView,
    Profile,
    RemoveModel,
    ReplicaState,
    Route,
    ScaleRequest,
)
from workflows.model.client import apply_model
from workflows.model.workflow import ModelWorkflow
from workflows.names import (
    external_replica_id,
    model_workflow_id,
    replica_id,
    replica_workflow_id,
)


def external(name: str, *urls: str, upstream_model: str = "") -> ModelSpec:
    profile = Profile(engine="external", urls=list(urls), upstream_model=upstream_model)
    return ModelSpec(name=name, profiles=[profile])


async def routes_of(cluster: Cluster, name: str) -> dict[str, Route]:
    return {rid: r for rid, r in (await cluster.ledger()).routes.items() if r.model == name}


async def apply(cluster: Cluster, spec: ModelSpec) -> ModelView:
    # What the CLI and the admin API call.
    view = await apply_model(cluster.client, spec, cluster.task_queue)
    cluster.started.append(cluster.client.get_workflow_handle(model_workflow_id(spec.name)))
    return view


async def no_workflow(cluster: Cluster, workflow_id: str) -> bool:
    try:
        await cluster.client.get_workflow_handle(workflow_id).describe()
    except RPCError as err:
        return err.status == RPCStatusCode.NOT_FOUND
    return False


async def test_external_urls_become_ready_routes_that_follow_the_definition(
    cluster: Cluster,
) -> None:
    name = unique("ext")
    first = external(name, "http://127.0.0.1:9000", "http://127.0.0.1:9001/v1/")
    view = await apply(cluster, first)
    assert view.spec.replicas == 2  # the URLs, whatever `replicas` said
    e0, e1, e2 = (external_replica_id(name, i) for i in range(3))

    async def published() -> bool:
        return sorted(await routes_of(cluster, name)) == [e0, e1]

    await eventually(published)
    routes = await routes_of(cluster, name)
    assert {rid: r.endpoint for rid, r in routes.items()} == {
        e0: "http://127.0.0.1:9000",
        e1: "http://127.0.0.1:9001",
    }
    for route in routes.values():
        assert route.state == ReplicaState.READY
        assert (route.engine, route.node, route.upstream_model) == ("external", "external", "")
        assert route.fingerprint == first.profile_fingerprint(0)
    assert await serving(cluster, first) == [e0, e1]
    state = await cluster.ledger()
    assert not [a for a in state.allocations.values() if a.model == name]
    assert await no_workflow(cluster, replica_workflow_id(name, 0))
    handle: WorkflowHandle[ModelWorkflow, ModelView] = cluster.client.get_workflow_handle_for(
        ModelWorkflow.run, model_workflow_id(name)
    )
    described = await ask(handle, ModelWorkflow.describe)
    assert described.replica_ids == [e0, e1]

    # A URL that stays keeps its replica id; one that goes is withdrawn; a new one is added.
    # Every route carries the name the endpoints know the model by.
    second = external(
        name, "http://127.0.0.1:9001", "https://upstream.example:8443/v1", upstream_model="m-8b"
    )
    await apply(cluster, second)

    async def replaced() -> bool:
        routes = await routes_of(cluster, name)
        return sorted(routes) == [e1, e2] and all(
            r.fingerprint == second.profile_fingerprint(0) and r.upstream_model == "m-8b"
            for r in routes.values()
        )

    await eventually(replaced)
    assert (await routes_of(cluster, name))[e2].endpoint == "https://upstream.example:8443"

    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(ModelWorkflow.scale, ScaleRequest(replicas=5))
    assert "one replica per URL" in str(refused.value.cause)

    await handle.execute_update(ModelWorkflow.remove, RemoveModel())
    result = await finished(cluster.client, handle.id, ModelView)
    assert result.removing
    assert await routes_of(cluster, name) == {}
    assert await no_workflow(cluster, replica_workflow_id(name, 0))
    await record_history(handle, "ModelExternal")


async def test_a_model_turned_external_stops_its_replicas(cluster: Cluster) -> None:
    await cluster.add_node(cores=8)
    name = unique("m")
    ordinary = ModelSpec(name=name, weights="/w/model.gguf", profiles=[Profile(memory_mb=256)])
    track_replicas(cluster, ordinary)
    await apply(cluster, ordinary)
    r0 = replica_id(name, 0)

    async def replica_serves() -> bool:
        return await serving(cluster, ordinary) == [r0]

    await eventually(replica_serves)

    await apply(cluster, external(name, "http://127.0.0.1:9000"))
    # Index 0 went to the replica, so the URL takes the next one.
    e1 = external_replica_id(name, 1)

    async def only_the_url() -> bool:
        return sorted(await routes_of(cluster, name)) == [e1]

    await eventually(only_the_url)

    async def replica_released() -> bool:
        return r0 not in (await cluster.ledger()).allocations

    await eventually(replica_released)
    assert cluster.agent.stops == [r0]

    handle = cluster.client.get_workflow_handle(model_workflow_id(name))
    await handle.execute_update(ModelWorkflow.remove, RemoveModel())
    await finished(cluster.client, handle.id)
    assert await routes_of(cluster, name) == {}


async def test_an_invalid_external_definition_is_refused_by_the_workflow(cluster: Cluster) -> None:
    name = unique("ext")
    await apply(cluster, external(name, "http://127.0.0.1:9000"))
    bad = external(name, "http://user:secret@127.0.0.1:9000")
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await apply_model(cluster.client, bad, cluster.task_queue)
    message = str(refused.value.cause)
    assert "profiles[0].urls[0]: credentials do not go in the URL" in message
    assert "secret" not in message
    handle = cluster.client.get_workflow_handle(model_workflow_id(name))
    await handle.execute_update(ModelWorkflow.remove, RemoveModel())
    await finished(cluster.client, handle.id)


async def test_each_urls_route_names_its_own_engines_kv_event_source(cluster: Cluster) -> None:
    name = unique("extkv")
    sources = [
        KvEventSource(endpoint="tcp://10.0.0.5:5557", replay="tcp://10.0.0.5:5558"),
        KvEventSource(endpoint="tcp://10.0.0.6:5557"),
    ]
    spec = external(name, "http://10.0.0.5:8000", "http://10.0.0.6:8000/v1")
    spec.profiles[0].external_kv = ExternalKv(sources=sources, block_size=32, hash_seed="0")
    await apply(cluster, spec)
    e0, e1 = (external_replica_id(name, i) for i in range(2))

    async def published() -> bool:
        return sorted(await routes_of(cluster, name)) == [e0, e1]

    await eventually(published)
    routes = await routes_of(cluster, name)
    assert routes[e0].kv == KvSource(
        block_size=32, hash_seed="0", publisher="tcp://10.0.0.5:5557", replay="tcp://10.0.0.5:5558"
    )
    assert routes[e1].kv == KvSource(block_size=32, hash_seed="0", publisher="tcp://10.0.0.6:5557")

    # The operator drops the events: the routes go back to the gateway's own prefix index.
    await apply(cluster, external(name, "http://10.0.0.5:8000", "http://10.0.0.6:8000/v1"))

    async def plain() -> bool:
        return all(r.kv is None for r in (await routes_of(cluster, name)).values())

    await eventually(plain)
    handle: WorkflowHandle[ModelWorkflow, ModelView] = cluster.client.get_workflow_handle_for(
        ModelWorkflow.run, model_workflow_id(name)
    )
    await handle.execute_update(ModelWorkflow.remove, RemoveModel())
    await finished(cluster.client, handle.id, ModelView)
