"""The cluster ledger under contention: placements are serialized, so nothing is handed out
twice, and a refusal says why (a node short of disk for a model's weights too)."""

import asyncio

import pytest
from temporalio.exceptions import ApplicationError

from activities.control.ledger_calls import update_ledger
from activities.control.ledger_cluster import allocate
from gateway.route_source import TemporalRouteSource
from tests.workflows.conftest import Cluster, record_history, unique
from workflows.artifact_names import artifact_hint
from workflows.contracts import (
    Allocation,
    PlacementRequest,
    Profile,
    ReleaseRequest,
    ReplicaState,
    Route,
    RoutingTable,
    RoutingTableRequest,
)
from workflows.ledger import NO_PLACEMENT, ClusterLedgerWorkflow
from workflows.names import LEDGER_WORKFLOW_ID


def one_core(replica: str) -> PlacementRequest:
    return PlacementRequest(
        replica_id=replica,
        model=replica.rsplit("-", 1)[0],
        profiles=[Profile(engine="llamacpp", engine_version="1", cpu_cores=1, memory_mb=64)],
    )


async def place(cluster: Cluster, replica: str) -> Allocation | ApplicationError:
    return await place_request(cluster, one_core(replica))


async def place_request(cluster: Cluster, req: PlacementRequest) -> Allocation | ApplicationError:
    try:
        return await allocate(cluster.client, req)
    except ApplicationError as err:
        return err


async def release(cluster: Cluster, replica: str) -> None:
    await update_ledger(
        cluster.client, ClusterLedgerWorkflow.release, ReleaseRequest(replica_id=replica)
    )


async def test_concurrent_placements_never_oversubscribe_a_node(cluster):
    await cluster.add_node(cores=8)
    model = unique("m")
    replicas = [f"{model}-{i}" for i in range(50)]

    outcomes = await asyncio.gather(*(place(cluster, r) for r in replicas))

    placed = [o for o in outcomes if isinstance(o, Allocation)]
    refused = [o for o in outcomes if isinstance(o, ApplicationError)]
    assert len(placed) == 8
    assert len(refused) == 42
    assert {a.node for a in placed} == {cluster.node}
    assert len({a.port for a in placed}) == 8
    for err in refused:
        assert err.type == NO_PLACEMENT
        assert f"{cluster.node}: 0 of 8 CPU cores free, 1 wanted" in err.message
    state = await cluster.ledger()
    mine = [a for a in state.allocations.values() if a.node == cluster.node]
    assert sorted(a.replica_id for a in mine) == sorted(a.replica_id for a in placed)
    assert sum(a.cpu_cores for a in mine) == 8

    # A retried placement (a control worker that died mid-call) gets the same answer.
    first = placed[0]
    assert await place(cluster, first.replica_id) == first

    # Releasing frees the cores and the port for the next replica.
    await release(cluster, first.replica_id)
    assert first.replica_id not in (await cluster.ledger()).allocations
    late = await place(cluster, f"{model}-late")
    assert isinstance(late, Allocation)
    assert (late.node, late.port) == (cluster.node, first.port)
    assert isinstance(await place(cluster, f"{model}-later"), ApplicationError)

    for replica in [late.replica_id, *(a.replica_id for a in placed[1:])]:
        await release(cluster, replica)
    state = await cluster.ledger()
    assert not [a for a in state.allocations.values() if a.node == cluster.node]


async def test_a_cluster_without_a_ready_node_refuses_with_its_nodes_reasons_summarised(cluster):
    await cluster.add_node(cores=8)
    await cluster.close()  # the node is lost now
    err = await place(cluster, f"{unique('m')}-0")
    assert isinstance(err, ApplicationError)
    assert err.type == NO_PLACEMENT
    # Grouped with the other tests' lost nodes ("node is lost: N nodes"), or alone with its
    # name: either way the reason, never a line per node.
    assert "node is lost" in err.message
    assert len(err.message) <= 600


@pytest.fixture(scope="module", autouse=True)
async def record_the_ledger(env, control_worker):  # noqa: ARG001 - it must outlive the recording
    yield
    await record_history(env.client.get_workflow_handle(LEDGER_WORKFLOW_ID), "ClusterLedger")


async def test_a_gateway_is_sent_the_routes_only_when_its_table_is_out_of_date(cluster):
    await cluster.add_node()
    source = TemporalRouteSource(cluster.client)
    first = await source.fetch()
    assert first.epoch
    assert not first.unchanged
    assert await source.fetch() is first, "nothing moved: the held table, no routes sent"

    replica = unique("rt") + "-0"
    route = Route(
        replica_id=replica,
        model="rt",
        node=cluster.node,
        endpoint="http://127.0.0.1:1",
        engine="llamacpp",
        state=ReplicaState.READY,
    )
    await update_ledger(cluster.client, ClusterLedgerWorkflow.set_route, route)
    second = await source.fetch()
    assert second.version > first.version
    assert replica in {r.replica_id for r in second.routes}

    # A table from another ledger (one started afresh, versions counted again) is replaced
    # even at the same version number.
    handle = cluster.client.get_workflow_handle(LEDGER_WORKFLOW_ID)
    stranger = RoutingTableRequest(epoch="another-ledger", version=second.version)
    answer = await handle.query(ClusterLedgerWorkflow.routing_table, stranger)
    assert not answer.unchanged
    assert replica in {r.replica_id for r in answer.routes}
    await release(cluster, replica)


async def test_a_gateway_taking_deltas_is_sent_only_what_changed(cluster):
    await cluster.add_node(cores=8)
    handle = cluster.client.get_workflow_handle(LEDGER_WORKFLOW_ID)
    source = TemporalRouteSource(cluster.client)
    whole = await source.fetch()

    async def since(version: int) -> RoutingTable:
        asking = RoutingTableRequest(epoch=whole.epoch, version=version, deltas=True)
        return await handle.query(ClusterLedgerWorkflow.routing_table, asking)

    # A placement changes no route: the gateway is sent nothing but the new version.
    replica = unique("dl") + "-0"
    alloc = await place(cluster, replica)
    assert isinstance(alloc, Allocation)
    quiet = await since(whole.version)
    assert quiet.unchanged
    assert quiet.version > whole.version
    assert not quiet.routes
    assert await source.fetch() is whole, "the held table: nothing rebuilt"

    held = whole.version
    route = Route(
        replica_id=replica,
        model=alloc.model,
        node=alloc.node,
        endpoint=f"http://{alloc.address}:{alloc.port}",
        engine="llamacpp",
        state=ReplicaState.READY,
    )
    await update_ledger(cluster.client, ClusterLedgerWorkflow.set_route, route)
    delta = await since(held)
    assert delta.delta
    assert [r.replica_id for r in delta.routes] == [replica]
    seen = await source.fetch()
    assert replica in {r.replica_id for r in seen.routes}

    # The same route said again moves the version, and sends nothing.
    await update_ledger(cluster.client, ClusterLedgerWorkflow.set_route, route)
    assert (await since(seen.version)).unchanged

    await release(cluster, replica)
    gone = await since(seen.version)
    assert gone.removed == [replica]
    assert replica not in {r.replica_id for r in (await source.fetch()).routes}


async def test_a_node_short_of_disk_for_the_weights_is_refused_unless_it_holds_them(cluster):
    weights = "sha256:" + "c4" * 32
    await cluster.add_node()
    node = (await cluster.ledger()).nodes[cluster.node]

    async def node_with(held: list[str]) -> None:
        inventory = node.inventory.model_copy(
            update={"artifacts": held, "artifact_disk_free_mb": 900}
        )
        record = node.model_copy(update={"inventory": inventory})
        await update_ledger(cluster.client, ClusterLedgerWorkflow.upsert_node, record)

    await node_with([])
    model = unique("big")
    request = one_core(f"{model}-0").model_copy(
        update={"artifact": weights, "artifact_size": 2 * 10**9}
    )
    err = await place_request(cluster, request)
    assert isinstance(err, ApplicationError)
    assert err.type == NO_PLACEMENT
    assert f"{cluster.node}: needs 2.5 GB of disk for the weights, 900 MB free" in err.message

    # A request without the size (a replica from before sizes were recorded) is placed.
    unsized = request.model_copy(update={"replica_id": f"{model}-1", "artifact_size": 0})
    assert isinstance(await place_request(cluster, unsized), Allocation)
    await release(cluster, unsized.replica_id)

    # Once the node holds the weights it needs no disk for them.
    await node_with([artifact_hint(weights)])
    placed = await place_request(cluster, request)
    assert isinstance(placed, Allocation)
    assert placed.node == cluster.node
    await release(cluster, request.replica_id)
