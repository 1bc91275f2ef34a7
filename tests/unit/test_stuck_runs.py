"""When the control worker takes a run for stuck (workers/stuck_runs.py): the same workflow task
pending in every check for the whole wait, by this process's clock."""

import asyncio
from datetime import datetime
from typing import cast

import pytest
from temporalio.client import Client

from workers import control
from workers.control import ledger_ids
from workers.stuck_runs import PendingTask, StuckTracker
from workflows.contracts.ledger import LedgerCells

FIRST = PendingTask(first_scheduled=datetime(2026, 12, 3, 12, 0, 0), attempt=1, started=False)
RETRIED = PendingTask(first_scheduled=FIRST.first_scheduled, attempt=4, started=True)
NEXT = PendingTask(first_scheduled=datetime(2026, 12, 3, 12, 0, 9), attempt=1, started=False)


def test_one_task_pending_for_the_whole_wait_is_stuck_and_says_so() -> None:
    tracker = StuckTracker(stuck_after_s=60)
    assert tracker.observe("cluster", FIRST, now=100) is None
    assert tracker.observe("cluster", FIRST, now=159) is None
    # Its retries are the same task: first scheduled at the same time.
    stuck = tracker.observe("cluster", RETRIED, now=160)
    assert stuck is not None
    assert stuck.workflow_id == "cluster"
    assert stuck.pending_for_s == 60
    assert stuck.describe() == (
        "cluster's workflow task has been pending for 60 s "
        "(started, attempt 4, first scheduled 2026-12-03 12:00:00 UTC)"
    )


def test_a_run_whose_tasks_keep_finishing_is_never_stuck() -> None:
    tracker = StuckTracker(stuck_after_s=60)
    assert tracker.observe("cluster", FIRST, now=100) is None
    assert tracker.observe("cluster", None, now=130) is None
    assert tracker.observe("cluster", NEXT, now=150) is None
    # A new task starts the wait over: 60 s from when it was first seen, not from the first.
    assert tracker.observe("cluster", NEXT, now=200) is None
    assert tracker.observe("cluster", NEXT, now=210) is not None


def test_a_failed_check_starts_the_wait_over() -> None:
    """A task seen before an outage of the server, and again just after it, waited through the
    outage: that is not a stuck run."""
    tracker = StuckTracker(stuck_after_s=60)
    tracker.observe("cluster", FIRST, now=100)
    tracker.forget("cluster")
    assert tracker.observe("cluster", FIRST, now=170) is None
    assert tracker.observe("cluster", FIRST, now=230) is not None


def test_runs_are_watched_apart_and_forgetting_all_forgets_each() -> None:
    tracker = StuckTracker(stuck_after_s=60)
    tracker.observe("cluster", FIRST, now=100)
    tracker.observe("cluster:1", FIRST, now=150)
    assert tracker.observe("cluster", FIRST, now=160) is not None
    assert tracker.observe("cluster:1", FIRST, now=160) is None
    tracker.forget()
    assert tracker.observe("cluster", FIRST, now=300) is None
    assert tracker.observe("cluster:1", FIRST, now=300) is None


class CellsAnswer:
    """A client whose ledger answers the `cells` query with `answer`, or never."""

    def __init__(self, answer: LedgerCells | None) -> None:
        self.answer = answer

    def get_workflow_handle(self, workflow_id: str) -> "CellsAnswer":
        return self

    async def query(self, *_: object) -> LedgerCells:
        if self.answer is None:
            await asyncio.Event().wait()
        assert self.answer is not None
        return self.answer


async def test_the_control_worker_watches_every_ledger_cell() -> None:
    client = cast(Client, CellsAnswer(LedgerCells(cells=3, fixed=False)))
    assert await ledger_ids(client) == ["cluster", "cluster:1", "cluster:2"]


async def test_a_ledger_that_never_answers_still_has_cell_0_watched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The count is a query to cell 0: stuck, it never answers, and it is the one to watch."""
    monkeypatch.setattr(control, "CELLS_QUERY_TIMEOUT_S", 0.05)
    assert await ledger_ids(cast(Client, CellsAnswer(None))) == ["cluster"]
