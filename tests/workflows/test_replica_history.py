"""A replica's history stays bounded however long it lives: it continues as new between engine
restarts and while it waits for room, carrying everything it knows, and records neither every
node's refusal nor engine output."""

from datetime import timedelta

import pytest
from temporalio.api.history.v1 import HistoryEvent

from tests.workflows.conftest import Cluster, eventually, finished, record_history, unique
from tests.workflows.test_replica import (
    decoded,
    describe,
    put_node,
    run_histories,
    skipping_time,
    spec,
    start_replica,
    stop_and_wait,
)
from workflows import history_budget, options
from workflows.contracts import (
    EngineState,
    NodeInventory,
    NodeRecord,
    NodeState,
    ReplicaState,
    StopReplica,
)
from workflows.replica.workflow import ReplicaWorkflow

# A run's events: the forced limit, plus what the engine cycles (about 50 events each) and a
# move off the node (about 35) between two safe points add.
FORCED = 40
RUN_BOUND = FORCED + 160


def activities_named(history: list[HistoryEvent], name: str) -> int:
    return sum(
        1
        for event in history
        if event.HasField("activity_task_scheduled_event_attributes")
        and event.activity_task_scheduled_event_attributes.activity_type.name == name
    )


async def test_a_crash_looping_replica_continues_as_new_keeps_counting_and_still_stops(
    dev_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On a dev server (conftest.dev_cluster says why): told to stop while its backoff timer
    # fired, the replica never closed on the time-skipping server. Timers run in real time
    # there, so the backoff is capped at a second.
    cluster = dev_cluster
    monkeypatch.setattr(options, "RESTART_BACKOFF_MAX", timedelta(seconds=1))
    monkeypatch.setattr(history_budget, "FORCE_EVERY_EVENTS", FORCED)
    await cluster.add_node()
    cluster.agent.crash_on_start = True
    # What a careless engine might print on its way out: long, several lines.
    cluster.agent.crash_reason = "engine exited: " + "prompt text\n" * 400
    rid, handle = await start_replica(cluster, spec())

    async with skipping_time(handle):

        async def looped() -> bool:
            return (await describe(handle)).restarts >= 7

        await eventually(looped, timeout=60)
        mid_loop = await describe(handle)
    view = await stop_and_wait(handle)
    await record_history(handle, "ReplicaCrashLoopContinued")

    # A crash loop shows one short line, and moved off (back onto) its only node.
    assert len(mid_loop.detail) < 300
    assert "\n" not in mid_loop.detail
    assert view.moved.startswith(f"re-placed after 5 failures on {cluster.node}: engine exited")
    assert view.moved.endswith(f"no other node can take it: back on {cluster.node}")
    # Restarts were counted across runs, and each run stayed small.
    assert view.state == ReplicaState.STOPPED
    assert view.restarts >= 7
    histories = await run_histories(cluster.client, handle.id)
    assert len(histories) >= 3, "the loop never continued as new"
    assert sum(len(events) for events in histories) > 2 * RUN_BOUND
    assert all(len(events) <= RUN_BOUND for events in histories), [len(h) for h in histories]
    assert len(cluster.agent.launches) in (view.restarts, view.restarts + 1)
    # The stop still reached the engine and released everything.
    assert cluster.agent.running() == []
    state = await cluster.ledger()
    assert rid not in state.allocations
    assert rid not in state.routes


async def test_a_restarted_replica_continues_as_new_on_its_allocation_without_placing_again(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(history_budget, "FORCE_EVERY_EVENTS", 30)
    await cluster.add_node()
    rid, handle = await start_replica(cluster, spec())
    async with skipping_time(handle):
        for restarts in range(4):

            async def serving(restarts: int = restarts) -> bool:
                view = await describe(handle)
                return view.state == ReplicaState.READY and view.restarts == restarts

            await eventually(serving)
            if restarts == 0:
                port = (await cluster.ledger()).allocations[rid].port
            if restarts < 3:
                cluster.agent.kill(rid)

    histories = await run_histories(cluster.client, handle.id)
    assert len(histories) >= 2, "never continued as new"
    # Placed once, in the first run; every later run started (or adopted) its engine there.
    assert [activities_named(h, "ledger_place") for h in histories] == [1] + [0] * (
        len(histories) - 1
    )
    assert (await cluster.ledger()).allocations[rid].port == port
    assert cluster.agent.launches == [rid] * 4

    view = await stop_and_wait(handle)
    assert view.state == ReplicaState.STOPPED
    assert view.restarts == 3
    await record_history(handle, "ReplicaRestartedContinued")
    # And a run that continued as new (the one before the last), with its patch marker.
    last = await handle.fetch_history()
    before = last.events[0].workflow_execution_started_event_attributes.continued_execution_run_id
    await record_history(
        cluster.client.get_workflow_handle(handle.id, run_id=before), "ReplicaRunContinuedAsNew"
    )
    assert cluster.agent.running() == []
    state = await cluster.ledger()
    assert rid not in state.allocations
    assert rid not in state.routes


async def test_a_replica_waiting_for_room_continues_as_new_and_is_placed_once_there_is_room(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(history_budget, "FORCE_EVERY_EVENTS", 30)
    await cluster.add_node(engine_state=EngineState.INSTALLING)
    rid, handle = await start_replica(cluster, spec())

    async with skipping_time(handle):

        async def continued_twice() -> bool:
            return len(await run_histories(cluster.client, handle.id)) >= 3

        await eventually(continued_twice, timeout=60)
    route = await cluster.route(rid)
    assert route is not None
    assert route.state == ReplicaState.PENDING
    assert route.detail.startswith("no node can take it: ")
    assert f"{cluster.node}: llamacpp installing" in route.detail
    assert cluster.agent.launches == []

    await cluster.add_node(engine_state=EngineState.INSTALLED)
    async with skipping_time(handle):

        async def ready() -> bool:
            view = await describe(handle)
            return view.state == ReplicaState.READY

        await eventually(ready, timeout=60)
        await handle.signal(ReplicaWorkflow.stop, StopReplica())
        await finished(cluster.client, handle.id)
    await record_history(handle, "ReplicaWaitedContinued")
    assert cluster.agent.launches == [rid]
    state = await cluster.ledger()
    assert rid not in state.allocations
    assert rid not in state.routes


async def test_a_refused_placement_records_a_summary_not_every_nodes_reason(
    cluster: Cluster,
) -> None:
    full = [unique("full") for _ in range(30)]
    for name in full:
        await put_node(cluster.fleet, name, cores=1)
    try:
        rid, handle = await start_replica(cluster, spec(cores=2))

        async def pending() -> bool:
            # The route's detail is written by an activity after the workflow's own: both.
            view = await describe(handle)
            written = await cluster.route(rid)
            summary = "1 of 1 CPU cores free, 2 wanted: 30 nodes"
            return summary in view.detail and written is not None and summary in written.detail

        await eventually(pending)
        route = await cluster.route(rid)
        assert route is not None
        assert route.detail == (await describe(handle)).detail
        assert len(route.detail) <= 600

        # The placement activity's answers are in the replica's history: summaries, no name.
        replica_text = decoded((await handle.fetch_history()).to_json_dict())
        assert "30 nodes" in replica_text
        assert not [name for name in full if name in replica_text]
        await handle.signal(ReplicaWorkflow.stop, StopReplica())
        await finished(cluster.client, handle.id)
    finally:
        for name in full:
            record = NodeRecord(inventory=NodeInventory(name=name), state=NodeState.REMOVED)
            await cluster.fleet.upsert_node(record)
