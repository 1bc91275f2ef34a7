"""Replay stored histories against today's workflow code: Temporal's check that a change to a
workflow cannot break the executions already running in a cluster.

A failure here means a workflow change is not deterministic for histories recorded before it:
guard the change with `workflow.patched(...)` rather than re-recording. Re-record (after a
deliberate, compatible change, or to cover a new workflow) with
`LLMGW_RECORD_HISTORIES=1 pytest tests/workflows` and commit the files it rewrites.
"""

import json
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.workflows.conftest import HISTORIES
from workers.registry import CONTROL_WORKFLOWS

FILES = sorted(HISTORIES.glob("*.json"))


def load(path: Path) -> WorkflowHistory:
    document = json.loads(path.read_text())
    return WorkflowHistory.from_json(document.pop("workflow_id"), document)


def workflow_type(history: WorkflowHistory) -> str:
    started = history.events[0].workflow_execution_started_event_attributes
    return started.workflow_type.name


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
async def test_history_replays_on_current_code(path):
    history = load(path)
    assert path.stat().st_size < 1_000_000, "keep stored histories small"
    replayer = Replayer(workflows=CONTROL_WORKFLOWS, data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{path.name} no longer replays: {result.replay_failure}"


def test_every_control_workflow_has_a_stored_history():
    stored = {workflow_type(load(path)) for path in FILES}
    # The registered name of each workflow class (`@workflow.defn(name=...)`).
    registered = {workflow._Definition.must_from_class(cls).name for cls in CONTROL_WORKFLOWS}
    missing = registered - stored
    assert not missing, (
        f"no history in {HISTORIES} for {sorted(missing)}: record one in its test with "
        "record_history(), then run LLMGW_RECORD_HISTORIES=1 pytest tests/workflows"
    )
