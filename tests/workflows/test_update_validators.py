"""A bad update is refused by its validator before anything is recorded: the workflow says why,
keeps what it had, and its history holds no trace of the refused update (so a bad update can
never wedge a workflow or replay into a failure)."""

from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError

from activities.control.node_admin import add_node
from tests.workflows.conftest import Cluster, ask, unique
from tests.workflows.test_catalog_lifecycle import cpu_spec, remove, start
from workflows.contracts import NodeAdd, RemoveModel
from workflows.model.workflow import ModelWorkflow
from workflows.names import node_workflow_id
from workflows.node.workflow import NodeWorkflow


async def accepted_updates(handle: WorkflowHandle[Any, Any]) -> int:
    history = await handle.fetch_history()
    accepted = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
    return sum(1 for event in history.events if event.event_type == accepted)


async def test_an_add_naming_another_node_is_refused_and_not_recorded(cluster: Cluster) -> None:
    name = unique("n")
    await add_node(cluster.client, NodeAdd(name=name, labels={"rack": "a"}), cluster.task_queue)
    handle = cluster.client.get_workflow_handle(node_workflow_id(name))
    cluster.started.append(handle)

    for bad, why in (
        (NodeAdd(name=unique("other"), labels={"rack": "b"}), "`add` names"),
        (NodeAdd(name=name, labels={" ": "b"}), "empty key"),
    ):
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(NodeWorkflow.add, bad)
        assert why in str(refused.value.cause)

    view = await ask(handle, NodeWorkflow.describe)
    assert view is not None
    assert view.record.labels == {"rack": "a"}
    assert await accepted_updates(handle) == 1, "only the first add was recorded"


async def test_a_removal_with_a_runaway_reason_is_refused_and_the_model_runs_on(
    cluster: Cluster,
) -> None:
    model = cpu_spec(replicas=0)
    handle = await start(cluster, model)
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(ModelWorkflow.remove, RemoveModel(reason="x\n" * 1000))
    assert "one line of at most" in str(refused.value.cause)
    view = await ask(handle, ModelWorkflow.describe)
    assert not view.removing
    assert await accepted_updates(handle) == 0
    await remove(cluster, handle)  # a good removal still works
