"""A replica on a node that does not answer: it still stops when told, holds its allocation
until the engine is known stopped or the node is gone, and moves off a node it keeps failing
on, saying why."""

from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.workflows.conftest import Cluster, eventually, finished, record_history, unique
from tests.workflows.fake_agent import FakeAgent
from tests.workflows.test_replica import (
    describe,
    put_node,
    skipping_time,
    spec,
    start_replica,
    stop_and_wait,
)
from workflows.contracts import NodeState, ReplicaState, ReplicaView, StopReplica
from workflows.names import node_task_queue
from workflows.replica.workflow import ReplicaWorkflow


async def test_a_replica_whose_agent_is_gone_stops_when_told_and_frees_only_once_the_node_is_gone(
    cluster: Cluster,
) -> None:
    ghost = unique("ghost")  # in the ledger, but no agent serves its queue
    await put_node(cluster.fleet, ghost)
    try:
        rid, handle = await start_replica(cluster, spec())

        async def launching() -> bool:
            view = await describe(handle)
            return view.state == ReplicaState.STARTING and view.node == ghost

        await eventually(launching)
        await handle.signal(ReplicaWorkflow.stop, StopReplica(reason="model removed"))

        # The launch nobody will ever take does not hold the stop up (real time: nothing skips).
        async def stopping() -> bool:
            return (await describe(handle)).state == ReplicaState.STOPPING

        await eventually(stopping, timeout=10)

        # Its engine may still run there: the allocation is held, the route not routable. The
        # route is written by an activity after the workflow's own state changed (a describe
        # may say stopping before the ledger does).
        async def route_stopping() -> bool:
            route = await cluster.route(rid)
            return route is not None and route.state == ReplicaState.STOPPING

        await eventually(route_stopping, timeout=10)
        assert rid in (await cluster.ledger()).allocations

        # The node is declared gone (what its model then sends): the stop waits no longer.
        await put_node(cluster.fleet, ghost, state=NodeState.LOST)
        await handle.signal(ReplicaWorkflow.stop, StopReplica(reason="node lost", engine_gone=True))
        async with skipping_time(handle):
            view = await finished(cluster.client, handle.id, ReplicaView, timeout=20)
        await record_history(handle, "ReplicaStoppedOnAgentlessNode")
        assert view.state == ReplicaState.STOPPED
        state = await cluster.ledger()
        assert rid not in state.allocations
        assert rid not in state.routes
    finally:
        await put_node(cluster.fleet, ghost, state=NodeState.REMOVED)


async def test_a_stop_for_a_node_declared_gone_still_reaches_an_agent_that_answers(
    cluster: Cluster,
) -> None:
    await cluster.add_node()
    rid, handle = await start_replica(cluster, spec())

    async def ready() -> bool:
        return (await describe(handle)).state == ReplicaState.READY

    await eventually(ready)
    await handle.signal(ReplicaWorkflow.stop, StopReplica(reason="node lost", engine_gone=True))
    async with skipping_time(handle):
        view = await finished(cluster.client, handle.id, ReplicaView)
    await record_history(handle, "ReplicaStoppedOnGoneNode")
    assert view.state == ReplicaState.STOPPED
    assert cluster.agent.stops == [rid]
    assert cluster.agent.running() == []
    state = await cluster.ledger()
    assert rid not in state.allocations
    assert rid not in state.routes


async def test_a_replica_failing_on_one_node_moves_to_another_and_says_why(
    cluster: Cluster, env: WorkflowEnvironment
) -> None:
    other = unique("n2")
    healthy = FakeAgent(other)
    async with Worker(env.client, task_queue=node_task_queue(other), activities=healthy.all()):
        await cluster.add_node(cores=16)  # preferred: the most free cores
        await put_node(cluster.fleet, other, cores=8)
        try:
            cluster.agent.crash_on_start = True
            cluster.agent.crash_reason = "CUDA error: uncorrectable ECC error encountered"
            rid, handle = await start_replica(cluster, spec())
            async with skipping_time(handle):

                async def serving_elsewhere() -> bool:
                    view = await describe(handle)
                    return view.state == ReplicaState.READY and view.node == other

                await eventually(serving_elsewhere, timeout=30)
            view = await describe(handle)
            assert view.moved == (
                f"re-placed after 5 failures on {cluster.node}: "
                "CUDA error: uncorrectable ECC error encountered"
            )
            assert view.restarts == 5
            assert cluster.agent.launches == [rid] * 5
            assert rid in cluster.agent.stops
            assert cluster.agent.running() == []
            assert (await cluster.ledger()).allocations[rid].node == other

            await stop_and_wait(handle)
            await record_history(handle, "ReplicaMovedAfterCrashes")
            assert healthy.running() == []
            state = await cluster.ledger()
            assert rid not in state.allocations
            assert rid not in state.routes
        finally:
            await put_node(cluster.fleet, other, state=NodeState.REMOVED)


async def test_a_port_another_program_holds_is_skipped_not_crash_looped(cluster: Cluster) -> None:
    """Seen: anything else listening on the node's first engine port left the demo replica
    `restarting` every 60 s, forever. Nothing started, so nothing is retried there."""
    await cluster.add_node()
    # The port placement hands out first is the one a stranger holds.
    cluster.agent.foreign_ports = {18000}
    rid, handle = await start_replica(cluster, spec())

    async def serving() -> bool:
        return (await describe(handle)).state == ReplicaState.READY

    await eventually(serving)
    view = await describe(handle)
    assert view.restarts == 0, "a port held by someone else is no crash"
    port = (await cluster.ledger()).allocations[rid].port
    assert port != 18000
    assert cluster.agent.launch_ports == [18000, port]
    assert cluster.agent.running() == [rid]
    await stop_and_wait(handle)
    assert cluster.agent.running() == []
    await record_history(handle, "ReplicaSkippedTakenPort")
