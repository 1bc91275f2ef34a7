"""A control worker's watch for a run its SDK holds stuck, ended by restarting the process.

After some failures inside the Python SDK a worker can keep a workflow run in its cache, unable
to evict it, and never finish the run's next workflow task: an activation that overran the
deadlock detector's 2 s (seen at 5,000 nodes), a nondeterminism error on a cached ledger run
that another control worker had advanced (seen after killing one of two control workers).
Temporal then holds every update and query to that run. For a ledger cell that is every
placement, route change and `llmgw status` of its nodes, with nothing in any log after the one
error. A fresh process has nothing cached: it replays the run from its history and goes on.

So every control worker describes each ledger cell every CHECK_EVERY_S (the history service
answers that, not a worker). A workflow task seen pending, the same one (first scheduled at the
same time), in every check for STUCK_AFTER_S is stuck. The worker then logs which and why, and
exits with STUCK_RUN_EXIT for its supervisor (`llmgw up`, systemd, compose, Kubernetes) to start
it again. It exits at once: the SDK's graceful shutdown waits for the very run that is stuck.
Which worker holds the run is not visible from outside, so each worker that sees it restarts;
a healthy one loses only its cache. A check that fails (Temporal unreachable or frozen) starts
the watch over: a task that waited through an outage of the server is not stuck.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from temporalio.api.enums.v1 import PendingWorkflowTaskState
from temporalio.client import Client
from temporalio.service import RPCError

log = logging.getLogger(__name__)

# EX_TEMPFAIL: try again. Every supervisor llmgw ships restarts a control worker on it.
STUCK_RUN_EXIT = 75


@dataclass(frozen=True)
class WatchSettings:
    check_every_s: float = 15.0
    # Far above a healthy wait: a frozen or killed worker's task moves to another worker within
    # 20 s (Temporal's 10 s sticky schedule-to-start timeout, then its 10 s task timeout).
    stuck_after_s: float = 60.0


@dataclass(frozen=True)
class PendingTask:
    """A run's pending workflow task, as DescribeWorkflowExecution gives it."""

    first_scheduled: datetime  # the same across the task's retries
    attempt: int
    started: bool


@dataclass(frozen=True)
class StuckRun:
    workflow_id: str
    task: PendingTask
    pending_for_s: float

    def describe(self) -> str:
        state = "started" if self.task.started else "scheduled"
        return (
            f"{self.workflow_id}'s workflow task has been pending for {self.pending_for_s:.0f} s "
            f"({state}, attempt {self.task.attempt}, first scheduled "
            f"{self.task.first_scheduled:%Y-%m-%d %H:%M:%S} UTC)"
        )


class StuckTracker:
    """Which watched runs have had the same workflow task pending in every check since when (by
    this process's monotonic clock: the server's may be set differently)."""

    def __init__(self, stuck_after_s: float) -> None:
        self.stuck_after_s = stuck_after_s
        self._since: dict[str, tuple[datetime, float]] = {}

    def observe(self, workflow_id: str, task: PendingTask | None, now: float) -> StuckRun | None:
        """One successful check of one run: the run if its task is now stuck."""
        if task is None:
            self._since.pop(workflow_id, None)
            return None
        seen = self._since.get(workflow_id)
        if seen is None or seen[0] != task.first_scheduled:
            self._since[workflow_id] = (task.first_scheduled, now)
            return None
        pending_for = now - seen[1]
        if pending_for < self.stuck_after_s:
            return None
        return StuckRun(workflow_id, task, pending_for)

    def forget(self, workflow_id: str | None = None) -> None:
        """A check that failed: that run's watch (or every run's) starts over."""
        if workflow_id is None:
            self._since.clear()
        else:
            self._since.pop(workflow_id, None)


async def pending_task(client: Client, workflow_id: str, timeout_s: float) -> PendingTask | None:
    handle = client.get_workflow_handle(workflow_id)
    described = await handle.describe(rpc_timeout=timedelta(seconds=timeout_s))
    raw = described.raw_description
    if not raw.HasField("pending_workflow_task"):
        return None
    info = raw.pending_workflow_task
    return PendingTask(
        first_scheduled=info.original_scheduled_time.ToDatetime(),
        attempt=info.attempt,
        started=info.state == PendingWorkflowTaskState.PENDING_WORKFLOW_TASK_STATE_STARTED,
    )


async def find_stuck_run(
    client: Client,
    watched: Callable[[], Awaitable[list[str]]],
    settings: WatchSettings,
) -> StuckRun:
    """Check the watched runs until one is stuck, and return it."""
    tracker = StuckTracker(settings.stuck_after_s)
    while True:
        await asyncio.sleep(settings.check_every_s)
        try:
            workflow_ids = await watched()
        except Exception as err:  # noqa: BLE001 - logged in _check_failed; the watch goes on
            _check_failed(err)
            tracker.forget()
            continue
        for workflow_id in workflow_ids:
            try:
                async with asyncio.timeout(settings.check_every_s):
                    task = await pending_task(client, workflow_id, settings.check_every_s)
            except Exception as err:  # noqa: BLE001 - logged in _check_failed; the watch goes on
                _check_failed(err)
                tracker.forget(workflow_id)
                continue
            stuck = tracker.observe(workflow_id, task, time.monotonic())
            if stuck is not None:
                return stuck


def _check_failed(err: Exception) -> None:
    # Temporal unreachable or slow is expected in an outage, and says nothing of a stuck run;
    # anything else is logged, but never ends the watch.
    if not isinstance(err, RPCError | TimeoutError):
        log.warning("a check for stuck runs failed: %r", err)


async def exit_when_a_run_is_stuck(
    client: Client,
    watched: Callable[[], Awaitable[list[str]]],
    settings: WatchSettings = WatchSettings(),
) -> None:
    stuck = await find_stuck_run(client, watched, settings)
    log.error(
        "%s: this worker may hold that run stuck in its cache (a known limit of the Python SDK "
        "after a failed activation), so it exits with status %d to be started again with an "
        "empty cache",
        stuck.describe(),
        STUCK_RUN_EXIT,
    )
    logging.shutdown()
    os._exit(STUCK_RUN_EXIT)
