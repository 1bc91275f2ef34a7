"""Node liveness through the watch (workflows/node/watch.py): heartbeats that write no history,
a dead agent found unreachable then lost, an agent restart that changes nothing, and an agent
from before the watch still heard through its heartbeat signals."""

import asyncio
import contextlib
from collections.abc import AsyncIterator

from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from tests.history_reading import node_states_published
from tests.workflows.conftest import (
    Cluster,
    activities_scheduled,
    ask,
    eventually,
    record_history,
    signal_across_runs,
    signals_handled,
    unique,
)
from tests.workflows.fake_agent import FakeAgent
from tests.workflows.test_node import ledger_record, node_handle, register, registration
from workflows.contracts import EngineState, NodeHeartbeat, NodeState, NodeView
from workflows.names import NodeActivity, node_task_queue, node_workflow_id
from workflows.node.workflow import NodeWorkflow


@contextlib.asynccontextmanager
async def agent_worker(client: Client, agent: FakeAgent, watch: bool = True) -> AsyncIterator[None]:
    """An agent process on the node's queue; leaving the block stops it as SIGTERM would: its
    watch says the agent stops, then its worker shuts down. watch=False: an agent from before
    the liveness watch."""
    activities = [a for a in agent.all() if watch or a != agent.watch]
    agent.stopping = agent.stop_told = False  # a new process
    async with Worker(client, task_queue=node_task_queue(agent.node), activities=activities):
        try:
            yield
        finally:
            agent.stopping = True
            await asyncio.sleep(0.5)  # the agent's hand-over (workers/agent.py HAND_OVER_S)


def node_handle_of(cluster: Cluster, node: str) -> WorkflowHandle[NodeWorkflow, NodeView | None]:
    return cluster.client.get_workflow_handle_for(NodeWorkflow.run, node_workflow_id(node))


async def history_length(client: Client, node: str) -> int:
    return len((await client.get_workflow_handle(node_workflow_id(node)).fetch_history()).events)


async def held_watch(client: Client, node: str) -> tuple[str, int]:
    """The node workflow's current run, and the latest heartbeat Temporal holds for its watch
    (0: no watch held yet)."""
    described = await client.get_workflow_handle(node_workflow_id(node)).describe()
    for pending in described.raw_description.pending_activities:
        details = pending.heartbeat_details.payloads
        if pending.activity_type.name == NodeActivity.WATCH_LIVENESS and details:
            [beat] = await client.data_converter.decode(details)
            return described.run_id or "", int(beat)
    return described.run_id or "", 0


@contextlib.asynccontextmanager
async def own_node(cluster: Cluster, prefix: str) -> AsyncIterator[str]:
    """A node of the test's own beside the cluster's, taken out of placement afterwards."""
    node = unique(prefix)
    try:
        yield node
    finally:
        record = (await cluster.ledger()).nodes.get(node)
        if record is not None:
            record.state = NodeState.LOST
            await cluster.fleet.upsert_node(record)


async def state_is(cluster: Cluster, node: str, state: NodeState) -> None:
    async def there() -> bool:
        record = (await cluster.ledger()).nodes.get(node)
        return record is not None and record.state == state

    there.__doc__ = f"{node} {state.value}"
    await eventually(there, timeout=30)


async def installed(cluster: Cluster) -> None:
    async def there() -> bool:
        record = await ledger_record(cluster)
        engine = record.engines.get("llamacpp") if record else None
        return engine is not None and engine.state == EngineState.INSTALLED

    await eventually(there, timeout=30)


async def test_heartbeats_write_no_history(cluster: Cluster) -> None:
    await register(cluster, cluster.node, registration(cluster.node, lost_after_s=3))
    await installed(cluster)

    async def watched() -> bool:
        # The watch asked for with the installed engine (the one asked for during the install
        # is replaced), its predecessor's cancellation answered.
        asked = cluster.agent.last_watch
        if asked is None or not asked.engines or cluster.agent.holding != 1:
            return False
        return (await held_watch(cluster.client, cluster.node))[1] > 0

    watched.__doc__ = "the agent holds the watch and Temporal has its heartbeats"
    await eventually(watched)
    run, first = await held_watch(cluster.client, cluster.node)
    before = await history_length(cluster.client, cluster.node)
    beats, watches = cluster.agent.beats, cluster.agent.watches

    async def many_beats() -> bool:
        return cluster.agent.beats >= beats + 40

    many_beats.__doc__ = "the agent heartbeated its watch 40 times"
    await eventually(many_beats, timeout=60)
    # 40 heartbeats, which reached Temporal (it holds a later one on the same watch of the same
    # run): not one history event, not one watch more.
    now_run, latest = await held_watch(cluster.client, cluster.node)
    assert (now_run, cluster.agent.watches) == (run, watches)
    assert latest > first
    assert await history_length(cluster.client, cluster.node) == before
    record = await ledger_record(cluster)
    assert record is not None
    assert record.state == NodeState.READY


async def test_a_dead_agent_makes_its_node_unreachable_then_lost(cluster: Cluster) -> None:
    async with own_node(cluster, "dead") as node:
        await dead_agent(cluster, node)


async def dead_agent(cluster: Cluster, node: str) -> None:
    agent = FakeAgent(node)
    async with agent_worker(cluster.client, agent):
        await register(cluster, node, registration(node, lost_after_s=3, gone_after_s=6))
        await state_is(cluster, node, NodeState.READY)
    # The agent is gone and takes no watch: unreachable past the grace, lost past the gone one.
    await state_is(cluster, node, NodeState.UNREACHABLE)
    record = (await cluster.ledger()).nodes[node]
    assert record.note.startswith("no heartbeat for")
    await state_is(cluster, node, NodeState.LOST)
    published = await node_states_published(cluster.client, node)
    assert [s for i, s in enumerate(published) if i == 0 or published[i - 1] != s] == [
        NodeState.READY.value,
        NodeState.UNREACHABLE.value,
        NodeState.LOST.value,
    ]
    # It comes back: the watch waiting for it is answered, and the node is ready again.
    async with agent_worker(cluster.client, agent):
        await state_is(cluster, node, NodeState.READY)
    await record_history(
        cluster.client.get_workflow_handle(node_workflow_id(node)), "NodeWatchDead"
    )


async def test_an_agent_restart_does_not_flap_its_node(cluster: Cluster) -> None:
    async with own_node(cluster, "restart") as node:
        await restarts(cluster, node)


async def restarts(cluster: Cluster, node: str) -> None:
    first = FakeAgent(node)
    async with agent_worker(cluster.client, first):
        await register(cluster, node, registration(node, lost_after_s=3, gone_after_s=6))
        await state_is(cluster, node, NodeState.READY)
    # Restarted as systemd restarts it: its watch said it stops, and its successor registers.
    second = FakeAgent(node)
    second.boot_id = "boot-2"
    worker = Worker(cluster.client, task_queue=node_task_queue(node), activities=second.all())
    running = asyncio.create_task(worker.run())
    await register(cluster, node, registration(node, boot_id="boot-2", lost_after_s=3))

    async def holds_watch() -> bool:
        return second.beats > 0

    await eventually(holds_watch)
    # Then killed: it falls silent holding its watch and takes nothing more, and its
    # successor registers while Temporal still counts that watch as held.
    second.silent = second.crashed = True
    killed = asyncio.create_task(worker.shutdown())
    third = FakeAgent(node)
    third.boot_id = "boot-3"
    # Another process: a connection of its own (one client runs one worker per queue).
    own = await Client.connect(
        cluster.client.service_client.config.target_host,
        namespace=cluster.client.namespace,
        data_converter=pydantic_data_converter,
    )
    async with agent_worker(own, third):
        await register(cluster, node, registration(node, boot_id="boot-3", lost_after_s=3))
        beats = third.beats
        # A sleep on purpose: two graces of real time, in which the node must stay ready.
        await asyncio.sleep(6)
        assert third.beats > beats, "the new agent holds the watch"
        assert set(await node_states_published(cluster.client, node)) == {NodeState.READY.value}
        described = await ask(node_handle_of(cluster, node), NodeWorkflow.describe)
        assert described.boot_id == "boot-3"
        await record_history(node_handle_of(cluster, node), "NodeWatchRestart")
    await killed
    await running


async def test_an_agent_without_the_watch_is_heard_through_its_signals(cluster: Cluster) -> None:
    async with own_node(cluster, "old") as node:
        await old_agent(cluster, node)


async def old_agent(cluster: Cluster, node: str) -> None:
    agent = FakeAgent(node)
    handle = node_handle_of(cluster, node)
    async with agent_worker(cluster.client, agent, watch=False):
        await register(cluster, node, registration(node, lost_after_s=3, gone_after_s=6))
        await state_is(cluster, node, NodeState.READY)
        # Heartbeat signals, as agents sent before the watch, keep it ready past its grace.
        for _ in range(5):
            await signal_across_runs(
                handle, NodeWorkflow.heartbeat, NodeHeartbeat(boot_id="boot-1")
            )
            await asyncio.sleep(1)  # a sleep on purpose: an agent's cadence
        assert set(await node_states_published(cluster.client, node)) == {NodeState.READY.value}

        # Silent past the grace: unreachable; a heartbeat from an earlier boot is not this
        # agent's, one from its own boot brings it back.
        await state_is(cluster, node, NodeState.UNREACHABLE)
        await signal_across_runs(handle, NodeWorkflow.heartbeat, NodeHeartbeat(boot_id="boot-0"))

        async def heard_out() -> bool:
            received, handled = await signals_handled(cluster.client, handle.id, "heartbeat")
            return handled == received

        heard_out.__doc__ = "the node workflow handled the boot-0 heartbeat"
        await eventually(heard_out)
        assert (await ask(handle, NodeWorkflow.describe)).record.state == NodeState.UNREACHABLE
        # Found old once, it is not asked for the watch again, by this run or the next: an
        # agent's "not registered" would read as an answer and bring the node back unheard.
        watches = await activities_scheduled(cluster.client, handle.id, NodeActivity.WATCH_LIVENESS)
        assert watches == 1
        await signal_across_runs(handle, NodeWorkflow.heartbeat, NodeHeartbeat(boot_id="boot-1"))
        await state_is(cluster, node, NodeState.READY)
    await record_history(handle, "NodeWatchOldAgent")


async def test_an_agent_that_fails_its_watch_is_alive_but_not_asked_in_a_loop(
    cluster: Cluster,
) -> None:
    cluster.agent.watch_error = ApplicationError("watch broke", non_retryable=True)
    await register(cluster, cluster.node, registration(cluster.node, lost_after_s=4))
    await installed(cluster)
    watches = cluster.agent.watches
    # A sleep on purpose: two graces of real time. A failed watch is an agent that answered:
    # the node stays ready, and the watch is asked again after a pause (half the grace), not
    # at once.
    await asyncio.sleep(8)
    record = await ledger_record(cluster)
    assert record is not None
    assert record.state == NodeState.READY
    assert 2 <= cluster.agent.watches - watches <= 6
    # Then it goes silent: the failed-watch pause does not hide that.
    cluster.agent.watch_error = None
    cluster.agent.silent = True
    await state_is(cluster, cluster.node, NodeState.UNREACHABLE)
    await record_history(node_handle(cluster), "NodeWatchFailed")
