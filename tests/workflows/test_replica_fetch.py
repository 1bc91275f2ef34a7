"""A replica of a model whose weights are a mirror artifact: its node fetches them before the
engine starts, the route says so meanwhile, a stop during the fetch ends it, and a fetch that
fails is a start that failed, restarted with back-off. A node without the disk for the weights
is not placed on until it has it."""

import asyncio

from temporalio.exceptions import ApplicationError

from tests.workflows.conftest import Cluster, eventually, finished
from tests.workflows.test_replica import spec, start_replica
from workflows.contracts import LoraAdapter, ModelSpec, ReplicaState, ReplicaView, StopReplica
from workflows.replica.workflow import ReplicaWorkflow

ARTIFACT = "sha256:" + "ab" * 32


def artifact_spec() -> ModelSpec:
    return spec().model_copy(update={"artifact": ARTIFACT, "weights": "model.gguf"})


async def state_and_detail(cluster: Cluster, rid: str) -> tuple[ReplicaState, str] | None:
    route = await cluster.route(rid)
    return None if route is None else (route.state, route.detail)


async def test_the_node_fetches_the_weights_before_the_engine_starts(cluster: Cluster) -> None:
    await cluster.add_node()
    agent = cluster.agent
    agent.fetch_gate = asyncio.Event()
    rid, handle = await start_replica(cluster, artifact_spec())

    async def fetching() -> bool:
        shown = await state_and_detail(cluster, rid)
        return shown == (ReplicaState.STARTING, "fetching the weights") and bool(agent.fetches)

    await eventually(fetching)
    assert agent.launches == [], "nothing starts before the weights are there"
    agent.fetch_gate.set()

    async def ready() -> bool:
        shown = await state_and_detail(cluster, rid)
        return shown is not None and shown[0] == ReplicaState.READY

    await eventually(ready)
    assert agent.fetches == [ARTIFACT]
    assert agent.launches == [rid]

    # A restart of the engine asks again, and the node answers at once from what it holds.
    agent.kill(rid)

    async def restarted() -> bool:
        view = await handle.query(ReplicaWorkflow.describe)
        return view.restarts == 1 and view.state == ReplicaState.READY

    await eventually(restarted)
    assert agent.fetches == [ARTIFACT, ARTIFACT]
    assert agent.launches == [rid, rid]
    await handle.signal(ReplicaWorkflow.stop, StopReplica(reason="done"))
    await finished(cluster.client, handle.id, ReplicaView)


async def test_a_stop_during_the_fetch_ends_the_replica_without_starting_it(
    cluster: Cluster,
) -> None:
    await cluster.add_node()
    cluster.agent.fetch_gate = asyncio.Event()  # a fetch that would take hours
    rid, handle = await start_replica(cluster, artifact_spec())
    await eventually(lambda: _fetch_started(cluster))
    await handle.signal(ReplicaWorkflow.stop, StopReplica(reason="scaled down"))
    view = await finished(cluster.client, handle.id, ReplicaView)
    assert view.state == ReplicaState.STOPPED
    assert cluster.agent.launches == []
    assert rid not in (await cluster.ledger()).allocations


async def test_a_failed_fetch_says_why_and_starts_nothing(cluster: Cluster) -> None:
    await cluster.add_node()
    cluster.agent.fetch_error = ApplicationError(
        "needs 12.0 GB, 3.1 GB free", type="NoSpace", non_retryable=True
    )
    _, handle = await start_replica(cluster, artifact_spec())

    async def said_why() -> bool:
        view = await handle.query(ReplicaWorkflow.describe)
        return "fetching the weights failed" in view.detail and "3.1 GB free" in view.detail

    await eventually(said_why)
    assert cluster.agent.launches == []
    await handle.signal(ReplicaWorkflow.stop, StopReplica(reason="done"))
    await finished(cluster.client, handle.id, ReplicaView)


async def _fetch_started(cluster: Cluster) -> bool:
    return bool(cluster.agent.fetches)


async def test_the_adapters_of_the_placed_profile_are_fetched_with_the_weights(
    cluster: Cluster,
) -> None:
    await cluster.add_node()
    adapter = "sha256:" + "cd" * 32
    model = artifact_spec()
    profile = model.profiles[0].model_copy(
        update={"lora": [LoraAdapter(name="sql", path="sql.gguf", artifact=adapter)]}
    )
    rid, handle = await start_replica(cluster, model.model_copy(update={"profiles": [profile]}))

    async def ready() -> bool:
        shown = await state_and_detail(cluster, rid)
        return shown is not None and shown[0] == ReplicaState.READY

    await eventually(ready)
    assert sorted(cluster.agent.fetches) == sorted([ARTIFACT, adapter])
    await handle.signal(ReplicaWorkflow.stop, StopReplica(reason="done"))
    await finished(cluster.client, handle.id, ReplicaView)


async def test_a_replica_waits_for_a_node_with_the_disk_for_its_weights(cluster: Cluster) -> None:
    await cluster.add_node()
    node = (await cluster.ledger()).nodes[cluster.node]

    async def node_with_free_disk(mb: int) -> None:
        inventory = node.inventory.model_copy(update={"artifact_disk_free_mb": mb})
        record = node.model_copy(update={"inventory": inventory})
        await cluster.fleet.upsert_node(record)

    await node_with_free_disk(900)
    model = artifact_spec().model_copy(update={"artifact_size": 2 * 10**9})
    rid, handle = await start_replica(cluster, model)
    why = "needs 2.5 GB of disk for the weights, 900 MB free"

    async def pending_for_disk() -> bool:
        route = await cluster.route(rid)
        return route is not None and route.state == ReplicaState.PENDING and why in route.detail

    await eventually(pending_for_disk)
    assert cluster.agent.fetches == []

    # Room made on the node (its agent reports it at its next look): the replica goes there.
    await node_with_free_disk(80_000)

    async def ready() -> bool:
        shown = await state_and_detail(cluster, rid)
        return shown is not None and shown[0] == ReplicaState.READY

    await eventually(ready, timeout=60)
    assert cluster.agent.fetches == [ARTIFACT]
    await handle.signal(ReplicaWorkflow.stop, StopReplica(reason="done"))
    await finished(cluster.client, handle.id, ReplicaView)
