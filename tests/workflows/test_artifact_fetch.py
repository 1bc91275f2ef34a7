"""A node's fetch of an artifact as its own workflow (ArtifactFetch, `fetch:<node>:<hex>`): two
replicas on a node share one download, a stop of one leaves the other's fetch running, the
fetch says how far it got, and a failed fetch says why in the Temporal UI as in the replica."""

import asyncio
from functools import partial
from typing import Any

from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from tests.workflows.conftest import Cluster, eventually, finished, record_history
from tests.workflows.test_replica_fetch import ARTIFACT, artifact_spec, state_and_detail
from workers.fetch_progress import fetch_status, fetches_table
from workflows.artifact_fetch import ArtifactFetchWorkflow
from workflows.contracts import (
    ArtifactFetchState,
    ArtifactFetchView,
    ModelSpec,
    ReplicaInput,
    ReplicaState,
    ReplicaView,
    StopReplica,
)
from workflows.names import (
    artifact_fetch_workflow_id,
    replica_id,
    replica_workflow_id,
)
from workflows.replica.workflow import ReplicaWorkflow

# A replica started: its id, and its workflow's handle.
Started = tuple[str, WorkflowHandle[Any, Any]]


async def start_at(cluster: Cluster, model: ModelSpec, index: int) -> Started:
    rid = replica_id(model.name, index)
    handle = await cluster.start(
        ReplicaWorkflow.run,
        ReplicaInput(replica_id=rid, model=model),
        id=replica_workflow_id(model.name, index),
    )
    return rid, handle


async def waiting_on_the_fetch(cluster: Cluster, handle: WorkflowHandle[Any, Any]) -> bool:
    """The replica waits on the node's fetch: it is registered with the shared fetch workflow,
    which will signal it the outcome."""
    fetch = cluster.client.get_workflow_handle(artifact_fetch_workflow_id(cluster.node, ARTIFACT))
    try:
        waiting = await fetch.query(ArtifactFetchWorkflow.waiting)
    except RPCError:  # not started yet
        return False
    return handle.id in waiting


async def ready(cluster: Cluster, rid: str) -> bool:
    shown = await state_and_detail(cluster, rid)
    return shown is not None and shown[0] == ReplicaState.READY


async def two_replicas_waiting(cluster: Cluster) -> tuple[Started, Started]:
    """Two replicas of one model on the cluster's node, both waiting on a fetch held back."""
    await cluster.add_node()
    cluster.agent.fetch_gate = asyncio.Event()
    model = artifact_spec()
    first, first_handle = await start_at(cluster, model, 0)
    second, second_handle = await start_at(cluster, model, 1)
    for handle in (first_handle, second_handle):
        await eventually(partial(waiting_on_the_fetch, cluster, handle))
    # Long enough for a second download to have begun, were there one.
    await asyncio.sleep(0.5)
    return (first, first_handle), (second, second_handle)


async def test_two_replicas_on_a_node_share_one_fetch_and_start_after_it(cluster: Cluster) -> None:
    (first, first_handle), (second, second_handle) = await two_replicas_waiting(cluster)
    assert cluster.agent.fetches == [ARTIFACT], "one download for both replicas"
    assert cluster.agent.launches == [], "nothing starts before the weights are there"
    for rid in (first, second):
        assert await state_and_detail(cluster, rid) == (
            ReplicaState.STARTING,
            "fetching the weights",
        )

    fetch = cluster.client.get_workflow_handle(artifact_fetch_workflow_id(cluster.node, ARTIFACT))
    view = await fetch.query(ArtifactFetchWorkflow.describe)
    assert (view.node, view.manifest, view.state) == (
        cluster.node,
        ARTIFACT,
        ArtifactFetchState.FETCHING,
    )

    assert cluster.agent.fetch_gate is not None  # the fetch held back
    cluster.agent.fetch_gate.set()
    await eventually(lambda: ready(cluster, first))
    await eventually(lambda: ready(cluster, second))
    assert cluster.agent.fetches == [ARTIFACT]
    assert sorted(cluster.agent.launches) == sorted([first, second])
    done = await finished(cluster.client, fetch.id, ArtifactFetchView)
    assert done.state == ArtifactFetchState.DONE
    assert done.path == f"/artifacts/{ARTIFACT}"
    await record_history(fetch, "ArtifactFetch")

    for handle in (first_handle, second_handle):
        await handle.signal(ReplicaWorkflow.stop, StopReplica(reason="done"))
        await finished(cluster.client, handle.id, ReplicaView)
    await record_history(first_handle, "ReplicaSharedFetch")


async def test_a_stop_during_a_shared_fetch_leaves_the_fetch_to_the_other_replica(
    cluster: Cluster,
) -> None:
    (first, first_handle), (second, _) = await two_replicas_waiting(cluster)
    await first_handle.signal(ReplicaWorkflow.stop, StopReplica(reason="scaled down"))
    view = await finished(cluster.client, first_handle.id, ReplicaView)
    assert view.state == ReplicaState.STOPPED
    assert first not in (await cluster.ledger()).allocations

    fetch = cluster.client.get_workflow_handle(artifact_fetch_workflow_id(cluster.node, ARTIFACT))
    assert (await fetch.describe()).status == WorkflowExecutionStatus.RUNNING
    assert cluster.agent.fetch_gate is not None  # the fetch held back
    cluster.agent.fetch_gate.set()
    await eventually(lambda: ready(cluster, second))
    assert cluster.agent.fetches == [ARTIFACT], "the stop did not end the download"
    assert cluster.agent.launches == [second]
    await record_history(first_handle, "ReplicaStoppedDuringSharedFetch")


async def test_a_running_fetch_shows_how_far_it_got(cluster: Cluster) -> None:
    (first, _), _ = await two_replicas_waiting(cluster)
    fetch_id = artifact_fetch_workflow_id(cluster.node, ARTIFACT)

    async def heartbeat_seen() -> bool:
        status = await fetch_status(cluster.client, fetch_id)
        return status is not None and status.report is not None

    await eventually(heartbeat_seen)
    status = await fetch_status(cluster.client, fetch_id)
    assert status is not None
    model = first.rsplit("-", 1)[0]
    shown = fetches_table([status]).splitlines()
    assert shown[0].split() == ["NODE", "ARTIFACT", "MODEL", "STATE", "PROGRESS", "DETAIL"]
    assert shown[1].split() == [
        cluster.node,
        "sha256:" + "ab" * 6,
        model,
        "fetching",
        "3.22",
        "of",
        "8.59",
        "GB",
        "(38%)",
        "fetching",
        "(model.gguf)",
    ]
    assert cluster.agent.fetch_gate is not None  # the fetch held back
    cluster.agent.fetch_gate.set()
    await eventually(lambda: ready(cluster, first))


async def test_a_failed_fetch_fails_its_workflow_with_the_nodes_reason(cluster: Cluster) -> None:
    await cluster.add_node()
    cluster.agent.fetch_error = ApplicationError(
        "fetching needs 12.0 GB, 3.1 GB free", type="NoSpace", non_retryable=True
    )
    _, handle = await start_at(cluster, artifact_spec(), 0)

    async def said_why() -> bool:
        view = await handle.query(ReplicaWorkflow.describe)
        return view.detail.startswith(
            f"fetching the weights failed on {cluster.node}: fetching needs 12.0 GB"
        )

    await eventually(said_why)
    assert cluster.agent.launches == []
    fetch = cluster.client.get_workflow_handle(artifact_fetch_workflow_id(cluster.node, ARTIFACT))
    assert (await fetch.describe()).status == WorkflowExecutionStatus.FAILED
    await record_history(fetch, "ArtifactFetchFailed")
    await handle.signal(ReplicaWorkflow.stop, StopReplica(reason="done"))
    await finished(cluster.client, handle.id, ReplicaView)
