"""A changed LoRA adapter list on a running model: replicas of an engine that loads adapters at
runtime (vLLM) get the new adapters without a restart, and their routes list them; one whose
engine refuses is replaced instead; llama.cpp, whose adapters are launch-time, still rolls."""

from temporalio.exceptions import ApplicationError

from tests.workflows.conftest import (
    Cluster,
    ask,
    eventually,
    record_history,
    signals_handled,
    unique,
)
from tests.workflows.test_catalog_lifecycle import remove, start
from tests.workflows.test_model import serving
from workflows.contracts import KvSource, LoraAdapter, ModelSpec, Profile, ReplicaState
from workflows.model.client import apply_model
from workflows.model.workflow import ModelWorkflow
from workflows.names import replica_id, replica_workflow_id

VLLM_VERSION = "0.32.0"
POEM_ARTIFACT = "sha256:" + "cd" * 32
SQL = LoraAdapter(name="sql", path="/adapters/sql")
POEM = LoraAdapter(name="poem", path="", artifact=POEM_ARTIFACT)


def adapter_spec(engine: str, adapters: list[LoraAdapter], replicas: int = 2) -> ModelSpec:
    profile = Profile(
        engine=engine,
        engine_version=VLLM_VERSION if engine == "vllm" else "1",
        cpu_cores=1,
        memory_mb=256,
        context_size=2048,
        lora=adapters,
    )
    return ModelSpec(name=unique("m"), weights="/w/model", replicas=replicas, profiles=[profile])


def with_adapters(model: ModelSpec, adapters: list[LoraAdapter]) -> ModelSpec:
    changed = model.model_copy(deep=True)
    changed.profiles[0].lora = adapters
    return changed


async def routes_list(cluster: Cluster, model: ModelSpec, names: list[str]) -> bool:
    """Every ready replica of the model lists exactly these adapters."""
    routes = [r for r in (await cluster.ledger()).routes.values() if r.model == model.name]
    ready = [r for r in routes if r.state == ReplicaState.READY]
    return len(ready) == model.replicas and all(r.adapters == names for r in ready)


async def test_a_vllm_replica_loads_new_adapters_without_a_restart(cluster: Cluster) -> None:
    await cluster.add_node(cores=16, engine="vllm", version=VLLM_VERSION)
    # Each engine reports where gateways hear its KV events, with the adapters it launched with.
    cluster.agent.kv = KvSource(feed="http://n1:8003", block_size=32, adapters={"sql": SQL.path})
    model = adapter_spec("vllm", [SQL])
    handle = await start(cluster, model)
    replicas = [replica_id(model.name, 0), replica_id(model.name, 1)]

    async def both_serving() -> bool:
        return await serving(cluster, model) == replicas

    await eventually(both_serving)

    # An adapter from the mirror is added: fetched on the node, loaded into each engine.
    added = with_adapters(model, [SQL, POEM])
    await apply_model(cluster.client, added, cluster.task_queue)

    async def serving_both_adapters() -> bool:
        return await routes_list(cluster, model, ["sql", "poem"])

    await eventually(serving_both_adapters, timeout=60)
    agent = cluster.agent
    assert sorted(agent.launches) == replicas, "no engine was restarted"
    assert agent.stops == []
    assert await serving(cluster, model) == replicas
    assert POEM_ARTIFACT in agent.fetches
    assert {call.replica_id for call in agent.adapter_calls} == set(replicas)
    assert all([a.name for a in call.adapters] == ["sql", "poem"] for call in agent.adapter_calls)
    view = await ask(handle, ModelWorkflow.describe)
    assert view.stale == []
    for rid in replicas:
        route = await cluster.route(rid)
        assert route is not None
        assert route.kv is not None
        # The KV router keys an adapter's blocks by its name and path, as the engine got them.
        assert set(route.kv.adapters) == {"sql", "poem"}

    # And one is removed: unloaded, still without a restart.
    await apply_model(cluster.client, with_adapters(model, [POEM]), cluster.task_queue)

    async def serving_poem_only() -> bool:
        return await routes_list(cluster, model, ["poem"])

    await eventually(serving_poem_only, timeout=60)
    assert sorted(agent.launches) == replicas
    assert all(agent.adapters[rid] == {"poem": ""} for rid in replicas)
    assert (await ask(handle, ModelWorkflow.describe)).stale == []

    await remove(cluster, handle)
    await record_history(handle, "ModelAdaptersAtRuntime")
    await record_history(
        cluster.client.get_workflow_handle(replica_workflow_id(model.name, 0)),
        "ReplicaAdaptersAtRuntime",
    )


async def test_a_replica_whose_engine_refuses_the_adapters_is_replaced(cluster: Cluster) -> None:
    await cluster.add_node(cores=16, engine="vllm", version=VLLM_VERSION)
    model = adapter_spec("vllm", [SQL], replicas=1)
    handle = await start(cluster, model)
    first = replica_id(model.name, 0)

    async def serving_first() -> bool:
        return await serving(cluster, model) == [first]

    await eventually(serving_first)
    cluster.agent.adapters_error = ApplicationError(
        "loading adapter poem: rank 64 is over --max-lora-rank 16",
        type="AdapterRefused",
        non_retryable=True,
    )
    await apply_model(cluster.client, with_adapters(model, [SQL, POEM]), cluster.task_queue)

    async def replaced() -> bool:
        names = await serving(cluster, model)
        return len(names) == 1 and names != [first] and first in cluster.agent.stops

    await eventually(replaced, timeout=60)
    assert len(cluster.agent.adapter_calls) == 1
    # Its successor was launched with both adapters.
    successor = (await serving(cluster, model))[0]
    assert cluster.agent.adapters[successor] == {"sql": SQL.path, "poem": ""}
    assert await routes_list(cluster, model, ["sql", "poem"])
    await remove(cluster, handle)


async def test_llamacpp_adapters_still_restart_the_replica(cluster: Cluster) -> None:
    await cluster.add_node(cores=16)
    gguf = LoraAdapter(name="sql", path="/adapters/sql.gguf")
    model = adapter_spec("llamacpp", [gguf], replicas=1)
    handle = await start(cluster, model)
    first = replica_id(model.name, 0)

    async def serving_first() -> bool:
        return await serving(cluster, model) == [first]

    await eventually(serving_first)
    poem = LoraAdapter(name="poem", path="/adapters/poem.gguf")
    await apply_model(cluster.client, with_adapters(model, [gguf, poem]), cluster.task_queue)

    async def rolled() -> bool:
        names = await serving(cluster, model)
        return len(names) == 1 and names != [first] and first in cluster.agent.stops

    await eventually(rolled, timeout=60)
    assert cluster.agent.adapter_calls == []
    assert await routes_list(cluster, model, ["sql", "poem"])
    await remove(cluster, handle)


async def test_new_adapters_told_while_the_engine_restarts_are_launched_with_it(
    cluster: Cluster,
) -> None:
    await cluster.add_node(cores=16, engine="vllm", version=VLLM_VERSION)
    model = adapter_spec("vllm", [SQL], replicas=1)
    handle = await start(cluster, model)
    rid = replica_id(model.name, 0)

    async def serving_it() -> bool:
        return await serving(cluster, model) == [rid]

    await eventually(serving_it)
    agent = cluster.agent
    agent.crash_on_start = True  # it keeps failing to start for a while
    agent.kill(rid)

    async def restarting() -> bool:
        route = await cluster.route(rid)
        return route is not None and route.state == ReplicaState.RESTARTING

    await eventually(restarting)
    await apply_model(cluster.client, with_adapters(model, [SQL, POEM]), cluster.task_queue)
    replica = replica_workflow_id(model.name, 0)

    async def told() -> bool:
        received, handled = await signals_handled(cluster.client, replica, "update_adapters")
        return received == handled == 1

    await eventually(told, timeout=30)
    agent.crash_on_start = False

    async def serving_both_adapters() -> bool:
        return await routes_list(cluster, model, ["sql", "poem"])

    await eventually(serving_both_adapters, timeout=90)
    # Started again with the new list: nothing to load at runtime, and no successor.
    assert agent.adapter_calls == []
    assert agent.adapters[rid] == {"sql": SQL.path, "poem": ""}
    assert set(agent.launches) == {rid}
    assert (await ask(handle, ModelWorkflow.describe)).stale == []
    await remove(cluster, handle)
