"""A node workflow on a real Temporal dev server (its clock is the wall clock the agent signs
with) takes a signed registration once: the same registration sent again, as anyone reading the
workflow's history could, is refused; one the agent signs anew is taken."""

import os
import shutil
import sys
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from workers.agent import register
from workers.search_attributes import ensure_search_attributes
from workflows.contracts import NodeInventory, NodeRegistration
from workflows.engine_keys import node_secret
from workflows.node.proof import identity_key, signed_registration
from workflows.node.workflow import NodeWorkflow

TEMPORAL = shutil.which("temporal") or os.path.join(os.path.dirname(sys.executable), "temporal")
SECRET = node_secret(b"m" * 32, "gpu-01")


@pytest.fixture(scope="module")
async def server() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=TEMPORAL,
        data_converter=pydantic_data_converter,
        dev_server_startup_timeout=timedelta(seconds=60),
    )
    await ensure_search_attributes(env.client)
    yield env
    await env.shutdown()


def registration(node: str, boot_id: str) -> NodeRegistration:
    inventory = NodeInventory(name=node, machine_id="machine-a", cpu_cores=8, memory_mb=16384)
    return NodeRegistration(inventory=inventory, boot_id=boot_id)


def now_ms() -> int:
    return int(time.time() * 1000)


async def test_a_registration_replayed_from_history_is_refused(
    server: WorkflowEnvironment,
) -> None:
    node = f"gpu-{uuid.uuid4().hex[:8]}"
    queue = f"control-{uuid.uuid4()}"
    # Only the workflow: its activities (engine plans, installs) wait on a queue nobody serves,
    # which the registration's update does not wait for.
    async with Worker(server.client, task_queue=queue, workflows=[NodeWorkflow]):
        first = signed_registration(registration(node, "boot-1"), SECRET, now_ms())
        view = await register(server.client, first, task_queue=queue)
        assert view.identity == identity_key(SECRET)

        # What history shows of that registration, sent again.
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await register(server.client, first.model_copy(), task_queue=queue)
        assert "a copy of one already taken" in str(refused.value.cause)

        # Another machine with a registration it signed with another token's secret.
        other = node_secret(b"m" * 32, "gpu-02")
        stranger = signed_registration(registration(node, "boot-x"), other, now_ms())
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await register(server.client, stranger, task_queue=queue)
        assert "joined with another token" in str(refused.value.cause)

        # The agent restarting signs anew: taken.
        again = signed_registration(registration(node, "boot-2"), SECRET, now_ms())
        view = await register(server.client, again, task_queue=queue)
        assert view.boot_id == "boot-2"
        await server.client.get_workflow_handle(f"node:{node}").terminate()
