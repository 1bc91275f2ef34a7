"""The node's liveness watch: how the node workflow knows its agent is alive without a history
event per heartbeat.

The workflow keeps one `node_watch_liveness` activity on the node's queue. The agent takes it and
heartbeats it to Temporal every few seconds; Temporal keeps an activity's heartbeats on the
pending activity, not in the workflow's history. The activity returns only when the workflow
must know something (the machine changed, the agent is stopping) or after NODE_WATCH_PERIOD,
so a node that changes nothing costs six history events a period instead of a signal, a
workflow task and a timer per heartbeat.

What the workflow learns from how a watch ends:

- it returned (or the agent failed or cancelled it): the agent is alive now;
- its heartbeat timed out: the agent took it and fell silent for half the grace. A suspicion,
  not a verdict: the control plane itself may have been away (a frozen Temporal fires the
  timeout the moment it thaws), so the workflow asks again at once with a probe, which an
  agent answers as soon as it takes it;
- nobody took it within its window (schedule-to-start): silence. The window is what is left
  of the grace (of the gone grace once unreachable), so the verdict falls when the old timer's
  did. A window that ran out well after it was due means the control plane was away: the node
  gets a fresh grace, as before;
- its agent has no such activity (an agent from before the watch): that agent heartbeats with
  signals, and the workflow goes back to judging those for this boot.
"""

import asyncio
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum

from temporalio import workflow
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    TimeoutError,
    TimeoutType,
)
from temporalio.workflow import ActivityHandle

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.contracts import NodeWatch, NodeWatchReport
    from workflows.node.calls import start_watch

# What the Python SDK's worker raises for an activity it has no function for: an agent from
# before the watch.
NOT_REGISTERED = "NotFoundError"
# What it reports for an activity still running when its worker shuts down: the agent stops.
WORKER_SHUTDOWN = "WorkerShutdown"


class Verdict(Enum):
    HEARD = "heard"  # the agent answered: alive now
    FAILED = "failed"  # the agent failed the watch: alive, ask again after a pause
    SUSPECT = "suspect"  # it took the watch and fell silent: probe at once
    SILENT = "silent"  # nobody took the watch within its window
    FORGIVEN = "forgiven"  # the window ran out while the control plane was away
    OLD_AGENT = "old-agent"  # the agent heartbeats with signals


def heartbeat_timeout(grace: timedelta) -> timedelta:
    """Half the grace: a heartbeat timeout, then a probe nobody takes for the other half, is
    the grace. Agents heartbeat many times within it (activities/agent/liveness.py)."""
    return max(grace / 2, timedelta(milliseconds=500))


def classify(error: BaseException | None, late: timedelta) -> Verdict:
    """What a watch that ended with `error` (None: it returned) says of the node; `late`: how
    long after its window ran out the workflow got to see it."""
    if error is None:
        return Verdict.HEARD
    cause = error.cause if isinstance(error, ActivityError) else error
    if isinstance(cause, TimeoutError):
        if cause.type == TimeoutType.SCHEDULE_TO_START:
            return Verdict.FORGIVEN if late > options.CONTROL_PLANE_AWAY else Verdict.SILENT
        return Verdict.SUSPECT  # heartbeat or start-to-close: it was taken, then went quiet
    if isinstance(cause, ApplicationError) and cause.type == NOT_REGISTERED:
        return Verdict.OLD_AGENT
    if isinstance(cause, CancelledError) or (
        isinstance(cause, ApplicationError) and cause.type == WORKER_SHUTDOWN
    ):
        return Verdict.HEARD  # the agent's worker shut down and said so
    return Verdict.FAILED


def _retrieved(done: "asyncio.Future[NodeWatchReport]") -> None:
    if not done.cancelled():
        done.exception()


@dataclass
class Outcome:
    verdict: Verdict
    report: NodeWatchReport | None = None
    detail: str = ""


class Watch:
    """The watch in flight, if any, with what its verdict needs: when it was asked for and how
    long an agent had to take it."""

    def __init__(self) -> None:
        self.handle: ActivityHandle[NodeWatchReport] | None = None
        self.window = timedelta(0)
        self.asked_at: datetime | None = None
        # What the watch in flight was asked (the engines its agent re-verifies).
        self.request: NodeWatch | None = None
        # After a failed watch, none before this.
        self.not_before: datetime | None = None

    def running(self) -> bool:
        return self.handle is not None

    def done(self) -> bool:
        return self.handle is not None and self.handle.done()

    def pause_left(self) -> timedelta | None:
        """How long until a watch may be asked for again; None: now."""
        if self.not_before is None or workflow.now() >= self.not_before:
            return None
        return self.not_before - workflow.now()

    def start(self, queue: str, watch: NodeWatch, window: timedelta, heartbeat: timedelta) -> None:
        self.not_before = None
        self.window, self.asked_at, self.request = window, workflow.now(), watch
        self.handle = start_watch(queue, watch, window, heartbeat)
        # Its end is judged when the workflow gets to it; one that ends as the run closes is
        # not an error never retrieved.
        self.handle.add_done_callback(_retrieved)

    def drop(self) -> None:
        """Cancel the watch in flight (a new agent registered: the old one may hold it)."""
        if self.handle is None:
            return
        handle, self.handle = self.handle, None
        handle.cancel()  # its cancellation is not awaited

    async def outcome(self) -> Outcome:
        """The finished watch's verdict; the watch is no longer in flight."""
        assert self.handle is not None
        handle, self.handle = self.handle, None
        due = (self.asked_at or workflow.now()) + self.window
        late = workflow.now() - due
        try:
            report = await handle
        except ActivityError as err:
            return Outcome(classify(err, late), detail=str(err.cause or err))
        return Outcome(Verdict.HEARD, report)
