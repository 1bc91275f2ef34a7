"""The replica lifecycle on the time-skipping server, with a stand-in agent.

Also the helpers the other test_replica_*.py files share."""

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle

from store.fleet import FleetTables
from tests.workflows.conftest import Cluster, ask, eventually, finished, runs_newest_first, unique
from workflows.contracts import (
    EngineExit,
    EngineState,
    EngineStatus,
    KvSource,
    ModelSpec,
    NodeInventory,
    NodeRecord,
    NodeState,
    ReplicaInput,
    ReplicaState,
    ReplicaView,
    StopReplica,
)
from workflows.names import replica_id, replica_workflow_id
from workflows.replica.workflow import ReplicaWorkflow


def spec(cores: int = 2) -> ModelSpec:
    return ModelSpec(name=unique("m"), weights="/w/model.gguf", cpu_cores=cores, engine_version="1")


async def start_replica(
    cluster: Cluster, model: ModelSpec
) -> tuple[str, WorkflowHandle[ReplicaWorkflow, ReplicaView]]:
    rid = replica_id(model.name, 0)
    handle = await cluster.start(
        ReplicaWorkflow.run,
        ReplicaInput(replica_id=rid, model=model),
        id=replica_workflow_id(model.name, 0),
    )
    return rid, handle


async def describe(handle: WorkflowHandle[Any, Any]) -> ReplicaView:
    """The replica's view, asked again while a run continues as new (conftest.ask)."""
    view: ReplicaView = await ask(handle, ReplicaWorkflow.describe)
    return view


@contextlib.asynccontextmanager
async def skipping_time(handle: WorkflowHandle[Any, Any]) -> AsyncIterator[None]:
    """The time-skipping server skips ahead only while someone waits on a workflow's result:
    wait on this one's in the background, so its backoffs and timeouts pass at once."""
    waiting = asyncio.create_task(handle.result())
    try:
        yield
    finally:
        if not waiting.done():
            waiting.cancel()
        with contextlib.suppress(BaseException):
            await waiting


async def stop_and_wait(handle: WorkflowHandle[Any, Any]) -> ReplicaView:
    """Stop the replica and wait until it has released, in real time: skipping time while the
    stand-in agent drains let the time-skipping server jump years ahead, past every workflow's
    default timeout."""
    await handle.signal(ReplicaWorkflow.stop, StopReplica())

    async def stopped() -> bool:
        # Closed, not only "stopped": the view says stopped before the workflow releases the
        # allocation and the route in the ledger, which it does last.
        described = await handle.describe()
        return described.status == WorkflowExecutionStatus.COMPLETED

    stopped.__doc__ = f"{handle.id} stopped and released"
    await eventually(stopped, timeout=90)
    return await describe(handle)


async def run_histories(client: Client, workflow_id: str) -> list[list[Any]]:
    """Each run's events, first run first, following continue-as-new back from the current."""
    return [events async for events in runs_newest_first(client, workflow_id)][::-1]


def decoded(document: Any) -> str:
    """A history (as JSON) with every payload's data decoded, so a test can search its text."""

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if "metadata" in node and isinstance(node.get("data"), str):
                return base64.b64decode(node["data"]).decode(errors="replace")
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return json.dumps(walk(document), ensure_ascii=False)


async def put_node(
    fleet: FleetTables, name: str, cores: int = 8, state: NodeState = NodeState.READY
) -> None:
    """A node as placement sees it in the fleet tables, whether or not any agent serves its
    queue."""
    record = NodeRecord(
        inventory=NodeInventory(name=name, cpu_cores=cores, memory_mb=16384),
        state=state,
        engines={
            "llamacpp": EngineStatus(
                engine="llamacpp", version="1", state=EngineState.INSTALLED, path="/x/llama"
            )
        },
    )
    await fleet.upsert_node(record)


async def test_replica_becomes_routable_restarts_after_exit_and_releases_on_stop(
    cluster: Cluster,
) -> None:
    await cluster.add_node()
    rid, handle = await start_replica(cluster, spec())

    async def ready() -> bool:
        route = await cluster.route(rid)
        return route is not None and route.state == ReplicaState.READY

    await eventually(ready)
    route = await cluster.route(rid)
    assert route is not None
    alloc = (await cluster.ledger()).allocations[rid]
    assert route.endpoint == f"http://127.0.0.1:{alloc.port}"
    assert route.node == cluster.node

    cluster.agent.kill(rid)

    async def restarted_and_ready() -> bool:
        view = await handle.query(ReplicaWorkflow.describe)
        return view.restarts == 1 and view.state == ReplicaState.READY

    await eventually(restarted_and_ready)
    assert cluster.agent.launches == [rid, rid]
    assert (await cluster.ledger()).allocations[rid].port == alloc.port  # restarted in place

    await handle.signal(ReplicaWorkflow.stop, StopReplica(reason="scaled down"))
    view = await finished(cluster.client, handle.id, ReplicaView)
    assert view.state == ReplicaState.STOPPED
    assert cluster.agent.stops == [rid]
    assert cluster.agent.running() == []
    state = await cluster.ledger()
    assert rid not in state.allocations
    assert rid not in state.routes


async def test_a_replica_publishing_kv_events_routes_with_where_to_read_them(
    cluster: Cluster,
) -> None:
    # What the agent reports at launch is what gateways read to route by the engine's cache,
    # and it stays on the route through a restart of the engine.
    await cluster.add_node()
    kv = KvSource(feed="http://127.0.0.1:8003", block_size=32, hash_seed="0")
    cluster.agent.kv = kv
    rid, handle = await start_replica(cluster, spec())

    async def ready_with(expected: KvSource | None, restarts: int) -> bool:
        route = await cluster.route(rid)
        view = await describe(handle)
        return (
            route is not None
            and route.state == ReplicaState.READY
            and view.restarts == restarts
            and route.kv == expected
        )

    await eventually(lambda: ready_with(kv, 0))
    # Relaunched by an agent whose feed is off: the route says so, and gateways stop using it.
    cluster.agent.kv = None
    cluster.agent.kill(rid)
    await eventually(lambda: ready_with(None, 1))


async def test_replica_waits_for_a_node_and_says_why(cluster: Cluster) -> None:
    await cluster.add_node(engine_state=EngineState.INSTALLING)
    rid, handle = await start_replica(cluster, spec())

    async def pending_with_reason() -> bool:
        view = await handle.query(ReplicaWorkflow.describe)
        return view.state == ReplicaState.PENDING and "llamacpp installing" in view.detail

    async def listed_with_reason() -> bool:
        """what `llmgw status` and the gateway see: the route the workflow writes just after"""
        listed = await cluster.route(rid)
        return listed is not None and "llamacpp installing" in listed.detail

    await eventually(pending_with_reason)
    await eventually(listed_with_reason)
    assert cluster.agent.launches == []
    listed = await cluster.route(rid)
    assert listed is not None
    assert listed.state == ReplicaState.PENDING
    assert listed.endpoint == ""

    await cluster.add_node(engine_state=EngineState.INSTALLED)

    async def ready() -> bool:
        route = await cluster.route(rid)
        return route is not None and route.state == ReplicaState.READY

    await eventually(ready, timeout=60)
    await handle.signal(ReplicaWorkflow.stop, StopReplica())
    await finished(cluster.client, handle.id)


async def test_engine_exit_reported_by_a_restarted_agent_restarts_the_engine(
    cluster: Cluster,
) -> None:
    await cluster.add_node()
    rid, handle = await start_replica(cluster, spec())

    async def ready() -> bool:
        view = await handle.query(ReplicaWorkflow.describe)
        return view.state == ReplicaState.READY

    await eventually(ready)
    # What an agent does at boot for an engine it finds dead: a signal, not a supervise result.
    cluster.agent.vanish(rid)
    await handle.signal(
        ReplicaWorkflow.engine_exited, EngineExit(replica_id=rid, reason="found dead at boot")
    )

    async def restarted() -> bool:
        view = await handle.query(ReplicaWorkflow.describe)
        return view.restarts == 1 and view.state == ReplicaState.READY

    await eventually(restarted)
    assert cluster.agent.launches == [rid, rid]
    await handle.signal(ReplicaWorkflow.stop, StopReplica())
    await finished(cluster.client, handle.id)
