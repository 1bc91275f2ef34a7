"""Terminate and Cancel from the Temporal CLI on a real `llmgw up`, under load: the node's, the
replica's and the model's workflows are terminated and cancelled in turn. No request fails, the
same engine process serves throughout, no second one starts, the agent is never restarted, and
every workflow runs again by itself (the model's once it is applied again, as documented)."""

import asyncio
import time
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowExecutionStatus

from tests.integration.test_outages import SteadyLoad, restarted
from tests.system import System, wait_for, wait_ready
from workflows.names import model_workflow_id, node_workflow_id, replica_workflow_id
from workflows.options import NODE_GRACE

pytestmark = [pytest.mark.integration, pytest.mark.long]

MODEL = "steady"


async def running_run(client: Client, workflow_id: str) -> str | None:
    """The run id of the workflow's open run; None while none is open."""
    described = await client.get_workflow_handle(workflow_id).describe()
    return described.run_id if described.status == WorkflowExecutionStatus.RUNNING else None


async def back(client: Client, workflow_id: str, old_run: str | None, timeout: float) -> str:
    """Wait until a run other than `old_run` of the workflow is open; its run id."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        run = await running_run(client, workflow_id)
        if run is not None and run != old_run:
            return run
        assert asyncio.get_running_loop().time() < deadline, f"{workflow_id} never came back"
        await asyncio.sleep(0.5)


async def test_terminate_and_cancel_stop_no_engine_and_fail_no_request(
    system: System, weights: Path
) -> None:
    system.cli("model", "add", MODEL, "--weights", str(weights), "--cpu-cores", "1")
    await wait_ready(system, MODEL, 1)
    engine = system.engine_pid(f"{MODEL}-0")
    assert engine is not None
    agent = system.child_pid("agent")
    client = await system.client()
    node_wf, replica_wf = node_workflow_id(system.node), replica_workflow_id(MODEL, 0)
    model_wf = model_workflow_id(MODEL)

    with SteadyLoad(system) as load:
        time.sleep(2)
        # 1. The node's workflow terminated: its agent registers again (within the node's
        # grace after its watch ends) rather than read "removed" and stop its engines.
        node_run = await running_run(client, node_wf)
        await client.get_workflow_handle(node_wf).terminate("operator (test)")
        node_run = await back(client, node_wf, node_run, NODE_GRACE.total_seconds() + 60)

        # 2. The replica's workflow terminated: its model starts it again (at its next look
        # at its replicas, within a minute), and the new run adopts the engine.
        replica_run = await running_run(client, replica_wf)
        await client.get_workflow_handle(replica_wf).terminate("operator (test)")
        replica_run = await back(client, replica_wf, replica_run, 120)

        # 3. Cancel on each: refused, the same runs go on.
        model_run = await running_run(client, model_wf)
        for workflow_id in (node_wf, replica_wf, model_wf):
            await client.get_workflow_handle(workflow_id).cancel()
        time.sleep(5)
        assert await running_run(client, node_wf) == node_run
        assert await running_run(client, replica_wf) == replica_run
        assert await running_run(client, model_wf) == model_run

        # 4. The model's workflow terminated, then the model applied again: the new run takes
        # over replica 0 instead of starting a second copy.
        await client.get_workflow_handle(model_wf).terminate("operator (test)")
        system.cli("model", "add", MODEL, "--weights", str(weights), "--cpu-cores", "1")
        await back(client, model_wf, model_run, 30)
        time.sleep(10)

    print(f"outcomes: {dict(load.outcomes)}")
    assert load.outcomes["200"] > 100
    assert load.failed == 0, f"requests failed: {dict(load.outcomes)}"
    assert system.engine_pid(f"{MODEL}-0") == engine, "the engine was restarted"
    assert system.engine_processes(str(weights)) == [engine], "a second engine runs"
    assert system.child_pid("agent") == agent
    assert not restarted(system, "agent")
    state = await system.ledger()
    assert [r for r in state.allocations if r.startswith(f"{MODEL}-")] == [f"{MODEL}-0"]
    assert [r for r in state.routes if r.startswith(f"{MODEL}-")] == [f"{MODEL}-0"]
    assert await system.ready_replicas(MODEL) == [f"{MODEL}-0"]
    system.cli("model", "rm", MODEL)
    wait_for(lambda: system.engine_pid(f"{MODEL}-0") is None, 60, "the replica to stop")
