"""The model's check of its replica workflows (activities/control/workflow_status.py): a batch is
described concurrently, a bounded number at a time, so 5,000 replicas (five batches of
workflows/options.py REPLICA_CHECK_BATCH) end well inside the activity's 30 s. A stand-in
client whose every describe takes 10 ms: one after another, one batch would take 10 s."""

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from activities.control.workflow_status import DESCRIBES_AT_ONCE, WorkflowStatusActivities
from workflows import options
from workflows.contracts import WorkflowIds


class SlowClient:
    def __init__(self, closed: dict[str, WorkflowExecutionStatus], fail: str = "") -> None:
        self.closed = closed
        self.fail = fail
        self.in_flight = 0
        self.most_in_flight = 0
        self.asked = 0

    def get_workflow_handle(self, workflow_id: str) -> Any:
        return SimpleNamespace(describe=lambda: self._describe(workflow_id))

    async def _describe(self, workflow_id: str) -> Any:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.asked += 1
        try:
            await asyncio.sleep(0.01)
            if workflow_id == self.fail:
                raise RPCError("unavailable", RPCStatusCode.UNAVAILABLE, b"")
            if workflow_id.endswith("-gone"):
                raise RPCError("not found", RPCStatusCode.NOT_FOUND, b"")
            status = self.closed.get(workflow_id, WorkflowExecutionStatus.RUNNING)
            return SimpleNamespace(status=status)
        finally:
            self.in_flight -= 1


async def test_5000_replicas_are_checked_in_batches_well_inside_the_timeout() -> None:
    ids = [f"replica:m:{i}" for i in range(5000)]
    ids[7] += "-gone"
    client = SlowClient({ids[3]: WorkflowExecutionStatus.TERMINATED})
    statuses = WorkflowStatusActivities(client)  # type: ignore[arg-type]
    batch = options.REPLICA_CHECK_BATCH
    began = time.monotonic()
    answers = await asyncio.gather(
        *(
            statuses.describe_workflows(WorkflowIds(workflow_ids=ids[at : at + batch]))
            for at in range(0, len(ids), batch)
        )
    )
    took = time.monotonic() - began
    assert took < options.DESCRIBE_WORKFLOWS_TIMEOUT.total_seconds() / 10
    assert client.asked == 5000
    assert client.most_in_flight <= DESCRIBES_AT_ONCE * len(answers)
    running = {k: v for a in answers for k, v in a.running.items()}
    closed = {k: v for a in answers for k, v in a.closed.items()}
    assert len(running) == 5000
    assert closed == {ids[3]: "terminated", ids[7]: "not_found"}
    assert [k for k, v in running.items() if not v] == [ids[3], ids[7]]
    # What crosses history for one batch: far under Temporal's 2 MB (and its 256 KB warning).
    assert len(WorkflowIds(workflow_ids=ids[:batch]).model_dump_json()) < 32 * 1024
    assert max(len(a.model_dump_json()) for a in answers) < 64 * 1024


async def test_one_batch_is_described_a_bounded_number_at_a_time() -> None:
    client = SlowClient({})
    ids = WorkflowIds(workflow_ids=[f"replica:m:{i}" for i in range(options.REPLICA_CHECK_BATCH)])
    await WorkflowStatusActivities(client).describe_workflows(ids)  # type: ignore[arg-type]
    assert 1 < client.most_in_flight <= DESCRIBES_AT_ONCE


async def test_no_answer_for_one_fails_the_whole_batch() -> None:
    """A partial answer would read as running for the ones not asked: the activity fails and
    the model looks again at its next check."""
    client = SlowClient({}, fail="replica:m:5")
    ids = WorkflowIds(workflow_ids=[f"replica:m:{i}" for i in range(100)])
    with pytest.raises(RPCError, match="unavailable"):
        await WorkflowStatusActivities(client).describe_workflows(ids)  # type: ignore[arg-type]
