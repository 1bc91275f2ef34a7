"""The agent's side of its node's liveness watch (workflows/node/watch.py).

The node workflow keeps one `node_watch_liveness` activity on the node's queue. The agent holds
it and heartbeats it to Temporal every few seconds with a line about the node; Temporal keeps a
heartbeat on the pending activity, not in the workflow's history. The activity returns only
when the workflow must hear something: the machine changed (the agent's periodic look found it),
an engine's re-verification came out other than the workflow recorded (the agent re-verifies
the engines the watch names every `verify_every_s`, in a thread, heartbeating meanwhile), the
agent is stopping, or the watch has run its course (`report_after_s`; 0 for a probe).

Nothing here ever stops an engine, and nothing waits on Temporal: while Temporal is away the
heartbeats simply do not arrive (the SDK retries them), and the workflow judges what that
means.
"""

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable

from temporalio import activity

from workflows.contracts import EngineStatus, NodeInventory, NodeWatch, NodeWatchReport
from workflows.names import NodeActivity

# However long the watch's heartbeat timeout, the agent heartbeats at least four times in it
# (the SDK sends at most one per 80% of the timeout, and at most one per its throttle).
BEATS_PER_TIMEOUT = 4

log = logging.getLogger("llmgw.agent")

# Re-verifies the given engines on this machine (blocking: run in a thread) and returns each
# one's status now (activities/agent/node_agent.py).
Verify = Callable[[list[EngineStatus]], list[EngineStatus]]


def differs(before: list[EngineStatus], now: list[EngineStatus]) -> bool:
    """Whether re-verification says something the workflow has not recorded (the time of the
    check alone is not news)."""

    def key(statuses: list[EngineStatus]) -> list[tuple[str, str, str, str]]:
        return sorted((s.engine, s.version, s.state, s.detail) for s in statuses)

    return key(before) != key(now)


class NodePulse:
    """What the watch reports: this boot of the agent, the machine as it last looked, and
    whether the agent is stopping."""

    def __init__(self, node: str, heartbeat_s: float, verify: Verify | None = None) -> None:
        self.node = node
        self.verify = verify
        # When the engines were last re-verified (time.monotonic()), across watches.
        self._verified_at: float | None = None
        self._verifying: asyncio.Future[list[EngineStatus]] | None = None
        self.boot_id = uuid.uuid4().hex
        self.heartbeat_s = heartbeat_s
        self.inventory: NodeInventory | None = None
        self.engines_running = 0
        self._changed = asyncio.Event()
        self._stopping = asyncio.Event()
        # Said once: a watch taken after that is held until the worker shuts down, rather
        # than answered at once and asked again, over and over, while the agent stops.
        self._stop_told = False
        self._watching = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._last_beat = time.monotonic()

    def look(self, inventory: NodeInventory, engines_running: int) -> None:
        """The machine as it looks now; a watch in flight reports it at once if it changed."""
        changed = self.inventory is None or inventory.digest() != self.inventory.digest()
        self.inventory, self.engines_running = inventory, engines_running
        if changed:
            self._changed.set()

    def stop(self) -> None:
        self._stopping.set()

    async def handed_over(self, timeout_s: float) -> None:
        """Wait (bounded) until the watch in flight has told the workflow the agent stops."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)

    def unwatched_for(self) -> float:
        """Seconds since this agent last held a watch: long, and its workflow may have ended."""
        return 0.0 if self._watching else time.monotonic() - self._last_beat

    def summary(self) -> str:
        engines = self.engines_running
        return f"node {self.node} (boot {self.boot_id[:8]}): {engines} engine(s) running"

    def _verification(self, req: NodeWatch) -> list[EngineStatus] | None:
        """Start the engines' re-verification when it is due, and once it is done, every
        engine's new status if any differs from what the watch was given (None otherwise)."""
        if self.verify is None or not req.engines or req.verify_every_s <= 0:
            return None
        running = self._verifying
        if running is not None and running.done():
            self._verifying = None
            self._verified_at = time.monotonic()
            try:
                now = running.result()
            except Exception as err:  # noqa: BLE001 - a broken check must not end the watch
                log.warning("re-verification failed: %s", err)
                return None
            return now if differs(req.engines, now) else None
        due = self._verified_at is None or (
            time.monotonic() - self._verified_at >= req.verify_every_s
        )
        if running is None and due:
            engines, verify = list(req.engines), self.verify
            self._verifying = asyncio.ensure_future(asyncio.to_thread(verify, engines))
            self._verifying.add_done_callback(lambda _: self._changed.set())
        return None

    def _report(self, digest: str) -> NodeWatchReport | None:
        stopping = self._stopping.is_set() and not self._stop_told
        self._stop_told = self._stop_told or stopping
        changed = bool(digest) and self.inventory is not None and self.inventory.digest() != digest
        if not (stopping or changed):
            return None
        return NodeWatchReport(
            boot_id=self.boot_id,
            inventory=self.inventory if changed else None,
            stopping=stopping,
        )

    @activity.defn(name=NodeActivity.WATCH_LIVENESS)
    async def watch(self, req: NodeWatch) -> NodeWatchReport:
        timeout = activity.info().heartbeat_timeout
        every = self.heartbeat_s
        if timeout:
            every = min(every, timeout.total_seconds() / BEATS_PER_TIMEOUT)
        deadline = time.monotonic() + req.report_after_s
        self._watching += 1
        self._idle.clear()
        try:
            while True:
                activity.heartbeat(self.summary())
                self._last_beat = time.monotonic()
                report = self._report(req.inventory_digest)
                verified = self._verification(req)
                if verified is not None:
                    report = report or NodeWatchReport(boot_id=self.boot_id)
                    report.engines = verified
                if report is not None:
                    return report
                left = deadline - time.monotonic()
                if left <= 0:
                    return NodeWatchReport(boot_id=self.boot_id)
                self._changed.clear()
                events = [self._changed] if self._stop_told else [self._changed, self._stopping]
                waits = [asyncio.ensure_future(event.wait()) for event in events]
                try:
                    await asyncio.wait(waits, timeout=min(every, left))
                finally:
                    for wait in waits:
                        wait.cancel()
        finally:
            self._watching -= 1
            if not self._watching:
                self._idle.set()
            self._last_beat = time.monotonic()
