"""A model of more replicas than one run may start (2,100) starts every one of them. Each
replica workflow a run starts stays a pending child of that run while it runs, and Temporal
refuses a run's 2,001st; the model starts at most REPLICAS_STARTED_PER_RUN a run and goes on in
the next.

The replicas are stand-ins (a workflow registered as `Replica` that waits for its stop), and
so are the activities the model calls: what is tested is the model's own bookkeeping.

A run asks for up to REPLICAS_STARTED_TOGETHER starts at once. The 2,100 run on a real
Temporal dev server of their own (about 30 s here; 3.5 minutes when a model started one replica
at a time). On a time-skipping test server, the session's shared one or a test file's own, a
run of starts stalled now and then (no replica started for 10 minutes; 1 run in 3 of the file's
own, where the others took 15 s). The count is just past Temporal's 2,000 pending children a
run, which is what the model's bound is for."""

import contextlib
import os
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.workflows.conftest import (
    CONTINUE_AS_NEW_EVERY,
    ask,
    eventually,
    record_history,
    start_dev_server,
    unique,
)
from workers.search_attributes import ensure_search_attributes
from workflows import options
from workflows.contracts import (
    LedgerAck,
    ModelName,
    ModelSpec,
    ModelState,
    ModelView,
    ReplicaInput,
    ReplicaState,
    ReplicaView,
    RoutingTable,
    StopReplica,
    WorkflowIds,
    WorkflowStatuses,
)
from workflows.model.workflow import ModelWorkflow
from workflows.names import (
    ControlActivity,
    model_workflow_id,
    replica_id,
    replica_workflow_id,
)

pytestmark = pytest.mark.long

REPLICAS = 2100
STARTED_PER_RUN_KNOB = "LLMGW_TEST_REPLICAS_STARTED_PER_RUN"


def model_worker(env: WorkflowEnvironment, queue: str) -> Worker:
    return Worker(
        env.client,
        task_queue=queue,
        workflows=[ModelWorkflow, StandInReplica],
        activities=[all_running, no_routes, idle_noted],
    )


@workflow.defn(name="Replica", sandboxed=False)
class StandInReplica:
    def __init__(self) -> None:
        self.stop_asked = False

    @workflow.run
    async def run(self, inp: ReplicaInput) -> ReplicaView:
        await workflow.wait_condition(lambda: self.stop_asked)
        return ReplicaView(
            replica_id=inp.replica_id, model=inp.model.name, state=ReplicaState.STOPPED
        )

    @workflow.signal(name="stop")
    def stop(self, req: StopReplica) -> None:
        self.stop_asked = True


@activity.defn(name=ControlActivity.DESCRIBE_WORKFLOWS)
async def all_running(ids: WorkflowIds) -> WorkflowStatuses:
    return WorkflowStatuses(running=dict.fromkeys(ids.workflow_ids, True))


@activity.defn(name=ControlActivity.LEDGER_MODEL_ROUTES)
async def no_routes(req: ModelName) -> RoutingTable:  # noqa: ARG001 - the contract's payload
    return RoutingTable()


@activity.defn(name=ControlActivity.LEDGER_SET_IDLE)
async def idle_noted(req: object) -> LedgerAck:  # noqa: ARG001 - the contract's payload
    return LedgerAck(version=1)


@pytest.fixture
async def dev_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_dev_server()
    try:
        yield env
    finally:
        await env.shutdown()


async def test_a_model_of_2100_replicas_starts_them_all_over_several_runs(
    dev_env: WorkflowEnvironment,
) -> None:
    env = dev_env
    await ensure_search_attributes(env.client)
    queue = unique("control")
    spec = ModelSpec(name=unique("m"), weights="/w/model.gguf", replicas=REPLICAS)
    async with model_worker(env, queue):
        # A run that starts 500 replicas on a loaded 2-core machine (continued runs inherit it).
        handle = await start_model(env, spec, queue, task_timeout=timedelta(seconds=60))
        try:

            async def all_started() -> bool:
                """every replica started"""
                # The view counts the replicas a run carries still to start: the runs' own
                # histories say which were started.
                view = await handle.query(ModelWorkflow.describe)
                if len(view.replica_ids) != REPLICAS:
                    return False
                return sum(await children_started_per_run(env, handle.id)) == REPLICAS

            await eventually(all_started, timeout=600)
            view = await ask(handle, ModelWorkflow.describe)
            assert len(set(view.replica_ids)) == REPLICAS
            started = await children_started_per_run(env, handle.id)
            assert len(started) >= REPLICAS // options.REPLICAS_STARTED_PER_RUN
            assert max(started) <= options.REPLICAS_STARTED_PER_RUN
            assert sum(started) == REPLICAS
        finally:
            # The replicas go with the server.
            await handle.terminate("test over")


async def start_model(
    env: WorkflowEnvironment, spec: ModelSpec, queue: str, task_timeout: timedelta | None = None
) -> WorkflowHandle[ModelWorkflow, ModelView]:
    return await env.client.start_workflow(
        ModelWorkflow.run,
        ModelState(spec=spec),
        id=model_workflow_id(spec.name),
        task_queue=queue,
        task_timeout=task_timeout,
    )


async def terminate(env: WorkflowEnvironment, workflow_id: str) -> None:
    with contextlib.suppress(RPCError):
        await env.client.get_workflow_handle(workflow_id).terminate("test over")


async def children_started_per_run(env: WorkflowEnvironment, workflow_id: str) -> list[int]:
    """How many child workflows each run of the model started, following continue-as-new."""
    started = EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    counts: list[int] = []
    run_id = (await env.client.get_workflow_handle(workflow_id).describe()).raw_description
    first = run_id.workflow_execution_info.first_run_id
    run: str | None = first
    while run:
        history = await env.client.get_workflow_handle(workflow_id, run_id=run).fetch_history()
        counts.append(sum(1 for e in history.events if e.event_type == started))
        last = history.events[-1]
        continued = last.workflow_execution_continued_as_new_event_attributes
        run = (
            continued.new_execution_run_id
            if last.HasField("workflow_execution_continued_as_new_event_attributes")
            else None
        )
    return counts


async def test_each_run_starts_at_most_its_share_and_the_next_goes_on(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same with 3 a run, small enough to store the history for the replay tests."""
    monkeypatch.setenv(STARTED_PER_RUN_KNOB, "3")
    await ensure_search_attributes(env.client)
    queue = unique("control")
    spec = ModelSpec(name=unique("m"), weights="/w/model.gguf", replicas=8)
    async with model_worker(env, queue):
        handle = await start_model(env, spec, queue)
        try:

            async def all_started() -> bool:
                """every replica's start is in the history of one of the model's runs"""
                # Not the model's own view: the time-skipping server opens the next run before
                # it appends the closing events of the one that continued as new, so for a moment
                # the chain of runs stops short of the run that started the last replicas.
                return sum(await children_started_per_run(env, handle.id)) == spec.replicas

            await eventually(all_started, timeout=60)
            view = await ask(handle, ModelWorkflow.describe)
            assert len(view.replica_ids) == spec.replicas
            started = await children_started_per_run(env, handle.id)
            if os.environ.get(CONTINUE_AS_NEW_EVERY):
                # Continue-as-new forced every few events may also end a run before its share.
                assert max(started) <= 3
            else:
                assert started == [3, 3, 2]
            first = env.client.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id)
            await record_history(first, "ModelStartsReplicasOverRuns")
        finally:
            await handle.terminate("test over")
            for index in range(spec.replicas):
                await terminate(env, replica_workflow_id(spec.name, index))


async def test_a_taken_index_is_skipped_and_another_started_in_its_place(
    env: WorkflowEnvironment,
) -> None:
    """A replica of an earlier model of this name still runs at index 1: the model's replicas,
    started together, never share its ID, and the count is still met."""
    await ensure_search_attributes(env.client)
    queue = unique("control")
    spec = ModelSpec(name=unique("m"), weights="/w/model.gguf", replicas=3)
    async with model_worker(env, queue):
        left = await env.client.start_workflow(
            StandInReplica.run,
            ReplicaInput(replica_id=replica_id(spec.name, 1), model=spec),
            id=replica_workflow_id(spec.name, 1),
            task_queue=queue,
        )
        handle = await start_model(env, spec, queue)
        try:

            async def three_started() -> bool:
                """three replicas started"""
                return len((await handle.query(ModelWorkflow.describe)).replica_ids) == 3

            await eventually(three_started, timeout=60)
            view = await ask(handle, ModelWorkflow.describe)
            assert view.replica_ids == [replica_id(spec.name, i) for i in (0, 2, 3)]
            # The earlier replica still runs, under its own run: its ID was not taken over.
            described = await left.describe()
            assert described.run_id == left.result_run_id
            assert described.status == WorkflowExecutionStatus.RUNNING
        finally:
            await handle.terminate("test over")
            for index in range(4):
                await terminate(env, replica_workflow_id(spec.name, index))
            await terminate(env, left.id)
