"""Replay stored histories against today's workflow code: Temporal's check that a change to a
workflow cannot break the executions already running in a cluster.

A failure here means a workflow change is not deterministic for histories recorded before it:
guard the change with `workflow.patched(...)` rather than re-recording. Histories are stored by
era (tests/workflows/histories/<era>/<name>.json) and never rewritten: after a change, record a
new era beside the old ones with `LLMGW_RECORD_HISTORIES=<era> pytest tests/workflows` and
commit the files it adds. An era replays for as long as a deployed cluster may hold its
executions, and no longer: docs/workflow-versions.md says which eras are kept (before the first
release, those of the work that last landed on main and newer; after it, those of the two
latest minor releases) and when a patch's old branch, then its call, goes with them.
"""

import ast
import base64
import json
from pathlib import Path
from typing import cast

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.source_reading import parse_file
from tests.workflows.conftest import CONTINUE_AS_NEW_EVERY, HISTORIES
from workers.registry import CONTROL_WORKFLOWS
from workflows import history_budget

FILES = sorted(HISTORIES.glob("*/*.json"))
WORKFLOW_CODE = Path(__file__).parents[2] / "workflows"


def load(path: Path) -> WorkflowHistory:
    document = json.loads(path.read_text())
    document.pop("continue_as_new_every", None)
    document.pop("test_knobs", None)
    return WorkflowHistory.from_json(document.pop("workflow_id"), document)


def forced_every(path: Path) -> int:
    """The continue-as-new knob the history was recorded with (0: none)."""
    return int(json.loads(path.read_text()).get("continue_as_new_every", 0))


def recorded_knobs(path: Path) -> dict[str, str]:
    """The other LLMGW_TEST_* settings the history was recorded with."""
    return dict(json.loads(path.read_text()).get("test_knobs", {}))


def workflow_type(history: WorkflowHistory) -> str:
    started = history.events[0].workflow_execution_started_event_attributes
    return started.workflow_type.name


@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}/{p.stem}" for p in FILES])
async def test_history_replays_on_current_code(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    history = load(path)
    # Replayed with the knob it ran under: the workflows that read it in the sandbox read the
    # environment, the others the shared module.
    every = forced_every(path)
    monkeypatch.setattr(history_budget, "FORCE_EVERY_EVENTS", every)
    monkeypatch.setenv(CONTINUE_AS_NEW_EVERY, str(every))
    for name, value in recorded_knobs(path).items():
        monkeypatch.setenv(name, value)
    assert path.stat().st_size < 1_000_000, "keep stored histories small"
    replayer = Replayer(workflows=CONTROL_WORKFLOWS, data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{path.name} no longer replays: {result.replay_failure}"


def test_every_control_workflow_has_a_stored_history() -> None:
    stored = {workflow_type(load(path)) for path in FILES}
    # The registered name of each workflow class (`@workflow.defn(name=...)`).
    # A name is None only for a dynamic workflow, and no control workflow is one.
    registered = {
        cast(str, workflow._Definition.must_from_class(cls).name) for cls in CONTROL_WORKFLOWS
    }
    missing = registered - stored
    assert not missing, (
        f"no history in {HISTORIES} for {sorted(missing)}: record one in its test with "
        "record_history(), then run LLMGW_RECORD_HISTORIES=<era> pytest tests/workflows"
    )


def patch_ids_in_code() -> set[str]:
    """Every id the workflow code passes to workflow.patched(), by literal or module constant."""
    ids: set[str] = set()
    for source in WORKFLOW_CODE.rglob("*.py"):
        tree = parse_file(source)
        constants = {
            target.id: node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            for target in node.targets
            if isinstance(target, ast.Name) and isinstance(node.value.value, str)
        }
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "patched"
                and node.args
            ):
                continue
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                ids.add(arg.value)
            elif isinstance(arg, ast.Name):
                assert arg.id in constants, f"{source}: patched({arg.id}) is not a constant"
                ids.add(constants[arg.id])
    return ids


def patch_ids_in_histories() -> set[str]:
    """The patch markers recorded in the stored histories."""
    ids: set[str] = set()
    for path in FILES:
        for event in json.loads(path.read_text())["events"]:
            marker = event.get("markerRecordedEventAttributes")
            if marker is None or marker.get("markerName") != "core_patch":
                continue
            for payload in marker["details"]["patch-data"]["payloads"]:
                ids.add(json.loads(base64.b64decode(payload["data"]))["id"])
    return ids


def test_every_patch_is_recorded_in_some_stored_history() -> None:
    """A patched() branch no stored history takes is a branch no replay test guards: the next
    change to it could break executions that took it without any test noticing."""
    missing = patch_ids_in_code() - patch_ids_in_histories()
    assert not missing, (
        f"no stored history records the patches {sorted(missing)}: record a new era with "
        "LLMGW_RECORD_HISTORIES=<era> pytest tests/workflows"
    )
