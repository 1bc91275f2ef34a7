"""A replica spanning two GPU nodes: placed on one fabric, leader started first, ready through
its leader, and restarted whole when one shard ends."""

import contextlib
from collections.abc import AsyncIterator

from temporalio.worker import Worker

from tests.workflows.conftest import Cluster, eventually, finished, record_history, unique
from tests.workflows.fake_agent import FakeAgent
from workflows.contracts import (
    EngineState,
    EngineStatus,
    GpuInfo,
    ModelSpec,
    NetworkPort,
    NodeInventory,
    NodeRecord,
    NodeState,
    Profile,
    ReplicaInput,
    ReplicaState,
    StopReplica,
)
from workflows.names import node_task_queue, replica_id, replica_workflow_id
from workflows.replica.workflow import ReplicaWorkflow


def gpu_node(name: str) -> NodeRecord:
    gpus = [
        GpuInfo(index=i, uuid=f"GPU-{name}-{i}", name="NVIDIA H100", gpu_class="h100-80g",
                memory_mb=81559, compute_capability="9.0")
        for i in range(4)
    ]  # fmt: skip
    ib = NetworkPort(device="mlx5_0", link_layer="InfiniBand", state="4: ACTIVE", rate_gbps=400)
    vllm = EngineStatus(engine="vllm", version="0.32.0", state=EngineState.INSTALLED, path="/v")
    return NodeRecord(
        inventory=NodeInventory(
            name=name, address=f"10.0.0.{len(name)}", cpu_cores=64, memory_mb=512000,
            gpus=gpus, network_ports=[ib], nvidia_driver="570.86",
        ),
        state=NodeState.READY,
        engines={"vllm": vllm},
    )  # fmt: skip


@contextlib.asynccontextmanager
async def gpu_nodes(cluster: Cluster, count: int) -> AsyncIterator[list[FakeAgent]]:
    agents = [FakeAgent(unique("gpu")) for _ in range(count)]
    async with contextlib.AsyncExitStack() as stack:
        for agent in agents:
            await stack.enter_async_context(
                Worker(cluster.client, task_queue=node_task_queue(agent.node),
                       activities=agent.all())
            )  # fmt: skip
            await cluster.fleet.upsert_node(gpu_node(agent.node))
        try:
            yield agents
        finally:
            state = await cluster.ledger()
            for agent in agents:
                record = state.nodes[agent.node]
                record.state = NodeState.LOST
                await cluster.fleet.upsert_node(record)


async def test_a_two_node_replica_starts_leader_first_and_restarts_whole(cluster: Cluster) -> None:
    profile = Profile(engine="vllm", engine_version="0.32.0", gpu_class="h100-80g",
                      gpus_per_node=4, nodes=2, tensor_parallel=4, pipeline_parallel=2,
                      cpu_cores=8, memory_mb=65536)  # fmt: skip
    model = ModelSpec(name=unique("big"), weights="/models/big", profiles=[profile])
    rid = replica_id(model.name, 0)
    async with gpu_nodes(cluster, 2) as agents:
        handle = await cluster.start(
            ReplicaWorkflow.run,
            ReplicaInput(replica_id=rid, model=model),
            id=replica_workflow_id(model.name, 0),
        )

        async def ready() -> bool:
            route = await cluster.route(rid)
            return route is not None and route.state == ReplicaState.READY

        await eventually(ready)
        alloc = (await cluster.ledger()).allocations[rid]
        assert alloc.fabric == "infiniband"
        leader, worker = alloc.shards
        assert {leader.node, worker.node} == {a.node for a in agents}
        assert (leader.rank, worker.rank) == (0, 1)
        assert len(leader.gpus) == len(worker.gpus) == 4
        route = await cluster.route(rid)
        assert route is not None
        assert route.node == leader.node  # requests go to the leader
        by_node = {a.node: a for a in agents}
        # The leader's launch came first: the worker connects to it.
        assert by_node[leader.node].launch_times[0] < by_node[worker.node].launch_times[0]

        # The worker's engine dies: the leader cannot serve alone, so both restart.
        by_node[worker.node].kill(rid)

        async def restarted() -> bool:
            view = await handle.query(ReplicaWorkflow.describe)
            return view.restarts == 1 and view.state == ReplicaState.READY

        await eventually(restarted, timeout=30)
        assert by_node[leader.node].stops == [rid]  # stopped, not adopted half-alive
        assert by_node[leader.node].launches == [rid, rid]
        assert by_node[worker.node].launches == [rid, rid]

        await handle.signal(ReplicaWorkflow.stop, StopReplica(reason="scaled down"))
        await finished(cluster.client, handle.id, timeout=30)
        await record_history(handle, "ReplicaMultiNode")
        assert all(a.running() == [] for a in agents)
        state = await cluster.ledger()
        assert rid not in state.allocations
