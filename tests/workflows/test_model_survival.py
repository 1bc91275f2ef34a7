"""The model workflow survives its own continue-as-new and its replicas' deaths: pending work is
carried, a removal still waits for its stopping replicas, a replica an operator terminated comes
back and adopts its engine (one being stopped is cleaned up instead), and a re-added model never
collides with a stopping replica's ID."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from temporalio import activity
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from tests.workflows.conftest import Cluster, ask, eventually, finished, record_history, unique
from tests.workflows.fake_agent import FakeAgent
from tests.workflows.test_model import held_by, serving, spec, track_replicas
from workflows.contracts import (
    EngineState,
    EngineStatus,
    ModelSpec,
    ModelState,
    ModelView,
    NodeInventory,
    NodeRecord,
    NodeState,
    Profile,
    RemoveModel,
    ReplaceReplicas,
    ReplicaInput,
    ReplicaState,
    ReplicaView,
    ScaleRequest,
    ShardRef,
    StopReplica,
    StopResult,
)
from workflows.model.workflow import ModelWorkflow
from workflows.names import (
    NodeActivity,
    model_workflow_id,
    node_task_queue,
    replica_id,
    replica_workflow_id,
)
from workflows.replica.workflow import ReplicaWorkflow

# The test knob of workflows/history_budget.py, read (in the sandbox) when a run starts.
CONTINUE_AS_NEW_EVERY = "LLMGW_TEST_CONTINUE_AS_NEW_EVERY"
# How often a model looks at its replica workflows (options.REPLICA_CHECK_EVERY), in seconds.
CHECK_EVERY = "LLMGW_TEST_REPLICA_CHECK_EVERY_S"


class SlowStopAgent(FakeAgent):
    """An agent whose engines take until the test says so to stop."""

    def __init__(self, node: str) -> None:
        super().__init__(node)
        self.let_stop = asyncio.Event()

    @activity.defn(name=NodeActivity.STOP_ENGINE)
    async def stop(self, ref: ShardRef) -> StopResult:
        await self.let_stop.wait()
        return await super().stop(ref)


class MuteStopAgent(FakeAgent):
    """An agent that cannot be reached for stops (the activity fails at once, as a timeout
    would after minutes) until the test lets it answer."""

    def __init__(self, node: str) -> None:
        super().__init__(node)
        self.answers = False
        # Stops it did not answer: one for each try (a model tries again at each check).
        self.unanswered = 0

    @activity.defn(name=NodeActivity.STOP_ENGINE)
    async def stop(self, ref: ShardRef) -> StopResult:
        if not self.answers:
            self.unanswered += 1
            raise ApplicationError("agent unreachable (test)", non_retryable=True)
        return await super().stop(ref)


@asynccontextmanager
async def node_with(cluster: Cluster, agent: FakeAgent) -> AsyncIterator[None]:
    """A ready node of this test served by `agent`, taken out of placement afterwards."""
    record = NodeRecord(
        inventory=NodeInventory(name=agent.node, cpu_cores=8, memory_mb=16384),
        state=NodeState.READY,
        engines={
            "llamacpp": EngineStatus(
                engine="llamacpp", version="1", state=EngineState.INSTALLED, path="/x/llama"
            )
        },
    )
    async with Worker(
        cluster.client, task_queue=node_task_queue(agent.node), activities=agent.all()
    ):
        await cluster.fleet.upsert_node(record)
        try:
            yield
        finally:
            agent.let_stop.set() if isinstance(agent, SlowStopAgent) else None
            record.state = NodeState.LOST
            await cluster.fleet.upsert_node(record)


async def run_id(cluster: Cluster, model: ModelSpec) -> str:
    described = await cluster.client.get_workflow_handle(model_workflow_id(model.name)).describe()
    assert described.run_id is not None
    return described.run_id


async def status(cluster: Cluster, workflow_id: str) -> WorkflowExecutionStatus | None:
    return (await cluster.client.get_workflow_handle(workflow_id).describe()).status


async def start_model(
    cluster: Cluster, state: ModelState
) -> WorkflowHandle[ModelWorkflow, ModelView]:
    return await cluster.start(ModelWorkflow.run, state, id=model_workflow_id(state.spec.name))


async def replica_0_serving(
    cluster: Cluster, model: ModelSpec
) -> WorkflowHandle[ReplicaWorkflow, ReplicaView]:
    """Replica 0 started on its own, as an earlier run of the model left it, and serving."""
    r0 = replica_id(model.name, 0)
    handle = await cluster.start(
        ReplicaWorkflow.run,
        ReplicaInput(replica_id=r0, model=model),
        id=replica_workflow_id(model.name, 0),
    )

    async def r0_ready() -> bool:
        return await serving(cluster, model) == [r0]

    await eventually(r0_ready)
    return handle


async def test_a_removal_still_waits_for_stopping_replicas_after_continuing_as_new(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = SlowStopAgent(unique("slow"))
    async with node_with(cluster, agent):
        model = spec(replicas=1)
        track_replicas(cluster, model)
        # Continue as new at every safe point past a few events, as a long-lived model does
        # (read when a run starts).
        monkeypatch.setenv(CONTINUE_AS_NEW_EVERY, "20")
        handle = await start_model(cluster, ModelState(spec=model))
        r0 = replica_id(model.name, 0)

        async def ready() -> bool:
            return await serving(cluster, model) == [r0]

        await eventually(ready)
        first_run = await run_id(cluster, model)
        await handle.execute_update(ModelWorkflow.remove, RemoveModel())

        async def continued() -> bool:
            return await run_id(cluster, model) != first_run

        # The replica cannot stop yet: the model waits for it through a new run.
        await eventually(continued, timeout=30)
        assert await status(cluster, model_workflow_id(model.name)) == (
            WorkflowExecutionStatus.RUNNING
        )
        assert (await held_by(cluster, model))[0] == [r0]

        agent.let_stop.set()
        result = await finished(cluster.client, handle.id, ModelView)
        assert result.removing
        # It returned only once its replica had stopped its engine and released.
        assert await held_by(cluster, model) == ([], [])
        assert agent.stops == [r0]


async def test_a_run_started_from_carried_state_carries_out_a_pending_move(
    cluster: Cluster,
) -> None:
    """What a continue-as-new carries: a replacement signalled but not yet carried out."""
    await cluster.add_node(cores=8)
    model = spec(replicas=1)
    track_replicas(cluster, model)
    r0, r1 = replica_id(model.name, 0), replica_id(model.name, 1)
    # Replica 0 as the previous run left it: running, serving.
    await replica_0_serving(cluster, model)
    move = ReplaceReplicas(replica_ids=[r0], reason="node drained", wait_for_successor=False)
    carried = ModelState(spec=model, next_index=1, indices=[0], replacements=[move])
    await start_model(cluster, carried)

    async def moved() -> bool:
        held = await held_by(cluster, model)
        return held == ([r1], [r1]) and await serving(cluster, model) == [r1]

    await eventually(moved)
    assert sorted(cluster.agent.stops) == [r0]


async def test_a_run_started_from_carried_state_waits_for_its_stopping_replicas(
    cluster: Cluster,
) -> None:
    agent = SlowStopAgent(unique("slow"))
    async with node_with(cluster, agent):
        model = spec(replicas=1)
        track_replicas(cluster, model)
        replica = await replica_0_serving(cluster, model)
        await replica.signal(ReplicaWorkflow.stop, StopReplica(reason="model removed"))
        # The previous run was removing the model and had told replica 0 to stop.
        removing = model.model_copy(update={"replicas": 0})
        carried = ModelState(spec=removing, removing=True, next_index=1, stopping=[0])
        handle = await start_model(cluster, carried)

        async def polled_twice() -> bool:
            events = [e async for e in handle.fetch_history_events()]
            scheduled = [
                e for e in events if e.HasField("activity_task_scheduled_event_attributes")
            ]
            return len(scheduled) >= 2

        await eventually(polled_twice, timeout=30)
        assert await status(cluster, model_workflow_id(model.name)) == (
            WorkflowExecutionStatus.RUNNING
        )
        agent.let_stop.set()
        await finished(cluster.client, handle.id)
        assert await held_by(cluster, model) == ([], [])


async def test_a_terminated_replica_comes_back_after_the_model_continued_as_new(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    await cluster.add_node(cores=8)
    model = spec(replicas=1)
    track_replicas(cluster, model)
    monkeypatch.setenv(CONTINUE_AS_NEW_EVERY, "12")
    monkeypatch.setenv(CHECK_EVERY, "1")
    handle = await start_model(cluster, ModelState(spec=model))
    r0 = replica_id(model.name, 0)

    async def r0_ready() -> bool:
        return await serving(cluster, model) == [r0]

    await eventually(r0_ready)
    first_run = await run_id(cluster, model)

    async def continued() -> bool:
        return await run_id(cluster, model) != first_run

    await eventually(continued)  # no child handle from here on
    replica = cluster.client.get_workflow_handle(replica_workflow_id(model.name, 0))
    terminated_run = (await replica.describe()).run_id

    # An operator terminates the replica in the Temporal UI: its engine, allocation and route
    # are left behind, and the model starts it again under its ID, adopting all three.
    await replica.terminate("operator")

    async def back() -> bool:
        described = await replica.describe()
        running = described.status == WorkflowExecutionStatus.RUNNING
        return running and described.run_id != terminated_run

    await eventually(back)
    await eventually(r0_ready)
    assert cluster.agent.stops == []
    assert cluster.agent.launches == [r0]
    assert cluster.agent.running() == [r0]
    assert await held_by(cluster, model) == ([r0], [r0])
    view = await ask(handle, ModelWorkflow.describe)
    assert view.replica_ids == [r0]
    await record_history(handle, "ModelTerminatedReplicaContinued")


async def test_scaling_down_onto_a_terminated_replica_cleans_it_up(cluster: Cluster) -> None:
    await cluster.add_node(cores=8)
    model = spec(replicas=2)
    track_replicas(cluster, model)
    handle = await start_model(cluster, ModelState(spec=model))
    r0, r1 = replica_id(model.name, 0), replica_id(model.name, 1)

    async def both_ready() -> bool:
        return await serving(cluster, model) == [r0, r1]

    await eventually(both_ready)
    await cluster.client.get_workflow_handle(replica_workflow_id(model.name, 1)).terminate(
        "operator"
    )
    # Before the model's periodic look notices: the scale-down signals a closed workflow.
    await handle.execute_update(ModelWorkflow.scale, ScaleRequest(replicas=1))

    async def cleaned() -> bool:
        return await held_by(cluster, model) == ([r0], [r0])

    await eventually(cleaned)
    assert await status(cluster, model_workflow_id(model.name)) == WorkflowExecutionStatus.RUNNING
    assert cluster.agent.stops == [r1]
    assert cluster.agent.running() == [r0]


async def test_a_re_added_model_skips_the_id_of_a_replica_still_stopping(cluster: Cluster) -> None:
    await cluster.add_node(cores=8)
    model = spec(replicas=1)
    track_replicas(cluster, model)
    # replica:<model>:0 of the model's earlier life still runs (it waits for room to stop in).
    earlier = model.model_copy(update={"profiles": [Profile(cpu_cores=10_000)]})
    await cluster.start(
        ReplicaWorkflow.run,
        ReplicaInput(replica_id=replica_id(model.name, 0), model=earlier),
        id=replica_workflow_id(model.name, 0),
    )
    handle = await start_model(cluster, ModelState(spec=model))
    r1 = replica_id(model.name, 1)

    async def r1_ready() -> bool:
        return await serving(cluster, model) == [r1]

    await eventually(r1_ready)
    assert await status(cluster, model_workflow_id(model.name)) == WorkflowExecutionStatus.RUNNING
    assert (await ask(handle, ModelWorkflow.describe)).replica_ids == [r1]
    assert cluster.agent.launches == [r1]


async def terminated_on_a_mute_node(
    cluster: Cluster, agent: MuteStopAgent, model: ModelSpec
) -> WorkflowHandle[ModelWorkflow, ModelView]:
    """Replicas 0 and 1 serve on the agent's node; a scale-down tells replica 1 to stop while
    the agent does not answer stops, and its workflow is terminated mid-stop. Returns the
    model's handle."""
    track_replicas(cluster, model)
    handle = await start_model(cluster, ModelState(spec=model))
    r0, r1 = replica_id(model.name, 0), replica_id(model.name, 1)

    async def both_ready() -> bool:
        return await serving(cluster, model) == [r0, r1]

    await eventually(both_ready)
    await handle.execute_update(ModelWorkflow.scale, ScaleRequest(replicas=1))

    async def stop_tried() -> bool:
        return agent.unanswered >= 1

    await eventually(stop_tried)
    await cluster.client.get_workflow_handle(replica_workflow_id(model.name, 1)).terminate(
        "operator"
    )
    tried = agent.unanswered
    # Several checks later the engine of replica 1 may still run: its allocation stays, so
    # nothing else is placed on what it holds.

    async def tried_to_stop_it_three_times() -> bool:
        return agent.unanswered >= tried + 3

    await eventually(tried_to_stop_it_three_times)
    allocations, _ = await held_by(cluster, model)
    assert allocations == [r0, r1]
    # In any order: the two replicas are placed and started concurrently.
    assert sorted(agent.running()) == [r0, r1]
    return handle


async def test_a_dead_replicas_allocation_is_kept_until_its_engine_stops(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = MuteStopAgent(unique("mute"))
    async with node_with(cluster, agent):
        model = spec(replicas=2)
        monkeypatch.setenv(CHECK_EVERY, "1")
        handle = await terminated_on_a_mute_node(cluster, agent, model)
        r0, r1 = replica_id(model.name, 0), replica_id(model.name, 1)
        agent.answers = True

        async def freed() -> bool:
            return await held_by(cluster, model) == ([r0], [r0])

        await eventually(freed)
        assert agent.running() == [r0]
        assert r1 in agent.stops
        await record_history(handle, "ModelStoppingReplicaTerminatedHeldUntilStopped")


async def test_a_dead_replicas_allocation_is_freed_once_its_node_is_gone(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = MuteStopAgent(unique("mute"))
    async with node_with(cluster, agent):
        model = spec(replicas=2)
        monkeypatch.setenv(CHECK_EVERY, "1")
        await terminated_on_a_mute_node(cluster, agent, model)
        r1 = replica_id(model.name, 1)
        described = await cluster.ledger()
        record = described.nodes[agent.node].model_copy(update={"state": NodeState.LOST})
        await cluster.fleet.upsert_node(record)

        async def freed() -> bool:
            allocations, _ = await held_by(cluster, model)
            return r1 not in allocations

        await eventually(freed)
        assert r1 not in agent.stops  # never reached: freed because its node is gone


async def test_a_removal_that_arrives_mid_pass_still_stops_every_replica(
    dev_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The model's first pass starts replica 0, then tells the fleet tables the model is not idle
    # (an activity). A removal accepted while that activity runs came after the pass had stopped
    # what it would stop: the model used to end there, its replica left running (seen in
    # `make test` after a control worker restart). Held here so the timing is certain. On a
    # dev server: on the time-skipping one its replica, told to stop, now and then never
    # closed (conftest.dev_cluster says why).
    cluster = dev_cluster
    await cluster.add_node(cores=8)
    model = spec(replicas=1)
    track_replicas(cluster, model)
    r0 = replica_id(model.name, 0)
    gate, reached = asyncio.Event(), asyncio.Event()
    original = cluster.fleet.set_idle

    async def held_set_idle(name: str, idle: bool) -> bool:
        if name == model.name:
            reached.set()
            await gate.wait()
        return await original(name, idle)

    monkeypatch.setattr(cluster.fleet, "set_idle", held_set_idle)
    handle = await start_model(cluster, ModelState(spec=model))
    await asyncio.wait_for(reached.wait(), 30)
    await handle.execute_update(ModelWorkflow.remove, RemoveModel())
    gate.set()

    await finished(cluster.client, handle.id)
    stopped = await finished(cluster.client, replica_workflow_id(model.name, 0), ReplicaView)
    assert stopped.state == ReplicaState.STOPPED
    assert cluster.agent.running() == []
    assert await held_by(cluster, model) == ([], [])
    assert r0 not in (await cluster.ledger()).routes
    await record_history(handle, "ModelRemovedMidPass")
