"""The node workflow's liveness: when its agent counts as heard, and what silence does to the
node (unreachable past its grace, lost past its gone grace, a fresh grace when the control
plane itself was away).

Two ways to hear an agent. The liveness watch (workflows/node/watch.py): an activity the agent
holds and heartbeats to Temporal, judged by how it ends, which writes no history per heartbeat.
And heartbeat signals with a timer, as every node was judged before the watch: kept for the
runs that began then, and for an agent that has no watch activity.

A mixin of NodeWorkflow (workflows/node/workflow.py), which owns the state these methods read.
"""

import asyncio
import contextlib
from datetime import datetime, timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.contracts import (
        EngineState,
        EngineStatus,
        NodeInventory,
        NodeState,
        NodeView,
        NodeWatch,
        VerifyEnginesResult,
    )
    from workflows.names import node_task_queue
    from workflows.node.rules import AgentSilent, take_verified
    from workflows.node.watch import Verdict, Watch, heartbeat_timeout

# Retired (docs/workflow-versions.md): the old branch is gone; deprecate_patch() still replays
# the histories that carry its marker.
AGENT_CALLS_WATCH_LIVENESS = "agent-calls-watch-liveness"
# Histories from before the agent re-verified its engines while holding the watch (only a
# changed result returns it) replay watches that carry no engines.
ENGINES_VERIFIED_ON_NODE = "engines-verified-on-node"
T = TypeVar("T")

# States whose agent is expected to answer; those with a liveness watch in flight.
LIVE = (NodeState.READY, NodeState.REGISTERING)
WATCHED = (*LIVE, NodeState.UNREACHABLE, NodeState.LOST)


class NodeLiveness:
    view: NodeView | None
    last_heard: datetime | None
    changed_inventory: NodeInventory | None
    # Liveness from the watch; signal_beats: this boot's agent heartbeats with signals instead.
    by_watch: bool
    signal_beats: bool
    watch: Watch
    # The watch's heartbeat timed out: the next one is a probe.
    suspect: bool
    # The machine as the agent last reported it (NodeInventory.digest).
    reported_digest: str

    # What the workflow itself provides.
    def _state(self) -> NodeState | None:
        raise NotImplementedError

    def _name(self) -> str:
        raise NotImplementedError

    def _has_work(self) -> bool:
        raise NotImplementedError

    async def _set_state(self, state: NodeState, note: str = "") -> None:
        raise NotImplementedError

    async def _move_replicas(self, reason: str, wait_for_successor: bool) -> None:
        raise NotImplementedError

    async def _publish(self) -> None:
        raise NotImplementedError

    def _forgive_control_plane_outage(self, due: datetime | None) -> None:
        """A timer that fires well after it was due means this workflow could not run: the
        Temporal server, its database or the control worker was away, and the agent's
        heartbeats could not arrive either. Its silence is then the control plane's, not the
        node's: start the grace again from now."""
        late = workflow.now() - due if due is not None else timedelta(0)
        if late > options.CONTROL_PLANE_AWAY:
            workflow.logger.warning(
                "control plane was away for about %ds: node %s gets a fresh grace",
                int(late.total_seconds()),
                self.view.record.inventory.name if self.view else "?",
            )
            self.last_heard = workflow.now()

    def _back(self) -> bool:
        """Heard from again after it was counted unreachable or lost."""
        silent = (NodeState.UNREACHABLE, NodeState.LOST)
        return self._state() in silent and self._silent_for() < self._grace()

    def _grace(self) -> timedelta:
        return timedelta(seconds=self.view.lost_after_s) if self.view else options.NODE_GRACE

    def _gone_grace(self) -> timedelta:
        if self.view is None:
            return options.NODE_GONE_GRACE
        return max(timedelta(seconds=self.view.gone_after_s), self._grace())

    def _silent_for(self) -> timedelta:
        return workflow.now() - (self.last_heard or workflow.now())

    def _until_lost(self) -> timedelta | None:
        """How long the loop may sleep before the node's liveness changes (unreachable, then
        lost); None: no timer."""
        state = self._state()
        if state in (NodeState.READY, NodeState.REGISTERING):
            remaining = self._grace() - self._silent_for()
        elif state == NodeState.UNREACHABLE:
            remaining = self._gone_grace() - self._silent_for()
        else:
            return None
        if self.view is not None and self.view.record.draining:
            remaining = min(remaining, options.DRAIN_POLL)
        return max(remaining, timedelta(seconds=1))

    async def _while_heard(self, call: asyncio.Future[T]) -> T:
        """The result of work on this node's agent (an activity, or an install's child
        workflow), unless the node falls silent past its grace first: then the work is
        cancelled and AgentSilent raised. A dead agent never answers, and the node cannot be
        seen lost while this workflow waits on it: an agent killed during a scheduled
        re-verification kept its node ready for minutes."""
        workflow.deprecate_patch(AGENT_CALLS_WATCH_LIVENESS)
        if self._watching():
            await self._while_watched(call)  # until it is done, or the agent proves old
        while not call.done():
            timeout = self._until_lost()
            due = workflow.now() + timeout if timeout is not None else None
            try:
                await workflow.wait_condition(call.done, timeout=timeout)
            except TimeoutError:
                self._forgive_control_plane_outage(due)
                if self._silent_for() >= self._grace():
                    call.cancel()
                    with contextlib.suppress(
                        ActivityError, ChildWorkflowError, asyncio.CancelledError
                    ):
                        await call  # the cancellation answered at once (TRY_CANCEL)
                    silent = int(self._silent_for().total_seconds())
                    raise AgentSilent(f"no heartbeat for {silent}s") from None
        return await call

    async def _while_watched(self, call: asyncio.Future[T]) -> None:
        """_while_heard for a watched node: wait until the call is done, unless a watch that
        ends meanwhile finds the node silent (it is then unreachable): the call is cancelled
        and AgentSilent raised. Returns early if the agent turns out to heartbeat with
        signals."""
        while not call.done() and self._watching():
            self._keep_watch()
            timeout = None if self.watch.running() else self.watch.pause_left()
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: call.done() or self.watch.done(), timeout=timeout
                )
            if call.done() or not self.watch.done():
                continue
            await self._judge_watch()
            if self._state() not in LIVE:
                call.cancel()
                with contextlib.suppress(ActivityError, ChildWorkflowError, asyncio.CancelledError):
                    await call
                silent = int(self._silent_for().total_seconds())
                raise AgentSilent(f"no heartbeat for {silent}s")

    def _watching(self) -> bool:
        return self.by_watch and not self.signal_beats

    def _heartbeat(self) -> timedelta:
        return heartbeat_timeout(self._grace())

    def _heard_at(self) -> datetime | None:
        """When the agent was last heard, for the next run. A watch in flight that has not
        timed out was heartbeated within its heartbeat timeout."""
        watched = self._watching() and self.watch.running() and self._state() in LIVE
        if watched and not self.suspect and self.last_heard is not None:
            return max(self.last_heard, workflow.now() - self._heartbeat())
        return self.last_heard

    async def _wait_watched(self) -> None:
        """Wait for work, or for the watch to end, and judge the watch if it did."""
        self._keep_watch()
        timeout = None if self.watch.running() else self.watch.pause_left()
        if self.view is not None and self.view.record.draining:
            timeout = min(timeout or options.DRAIN_POLL, options.DRAIN_POLL)
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(
                lambda: self._has_work() or self.watch.done(), timeout=timeout
            )
        if self.watch.done():
            await self._judge_watch()

    def _keep_watch(self) -> None:
        """Keep a watch in flight whenever an agent may answer one."""
        if self.view is None or self._state() not in WATCHED or not self._watching():
            return
        if self.watch.running() and self._engines_moved():
            # The watch in flight re-verifies engines the record no longer has (an install
            # finished): ask again with the record's. It was heartbeated within its timeout.
            self.last_heard = self._heard_at()
            self.watch.drop()
        if self.watch.running() or self.watch.pause_left() is not None:
            return
        # A node under suspicion, or already found silent, is probed: answered at once.
        probe = self.suspect or self._state() not in LIVE
        request = NodeWatch(
            node=self._name(),
            report_after_s=0 if probe else options.NODE_WATCH_PERIOD.total_seconds(),
            inventory_digest=self.reported_digest or self.view.record.inventory.digest(),
        )
        if workflow.patched(ENGINES_VERIFIED_ON_NODE):
            # The agent re-verifies these itself and returns the watch only when a result
            # differs: no refresh signal, activity or record write while nothing changes.
            request.engines = self._verified_on_node()
            request.verify_every_s = options.ENGINE_REVERIFY_ON_NODE.total_seconds()
        queue = node_task_queue(self._name())
        # A lost node's agent may be hung (it takes the probe and says nothing): it is given a
        # whole period to answer, rather than probed again every half grace.
        lost = self._state() == NodeState.LOST
        heartbeat = options.NODE_WATCH_PERIOD if lost else self._heartbeat()
        self.watch.start(queue, request, self._watch_window(), heartbeat)

    def _verified_on_node(self) -> list[EngineStatus]:
        """The engines the agent re-verifies: those installed, or failed with a path."""
        assert self.view is not None
        runnable = (EngineState.INSTALLED, EngineState.FAILED)
        engines = self.view.record.engines.values()
        return [s for s in engines if s.state in runnable and s.path]

    def _engines_moved(self) -> bool:
        """A healthy watch in flight was asked to re-verify other engines than the record's."""
        asked = self.watch.request
        if asked is None or asked.report_after_s == 0 or self.suspect:
            return False
        if self._state() not in LIVE or not workflow.patched(ENGINES_VERIFIED_ON_NODE):
            return False
        return asked.engines != self._verified_on_node()

    def _watch_window(self) -> timedelta:
        """How long an agent has to take the next watch: until the node's liveness changes."""
        if self._state() == NodeState.LOST:
            return options.NODE_WATCH_PERIOD  # nothing left to lose: it is asked to come back
        grace = self._grace() if self._state() in LIVE else self._gone_grace()
        return max(grace - self._silent_for(), timedelta(seconds=1))

    async def _judge_watch(self) -> None:
        outcome = await self.watch.outcome()
        now, verdict, report = workflow.now(), outcome.verdict, outcome.report
        name = self._name()
        if verdict in (Verdict.HEARD, Verdict.FAILED, Verdict.OLD_AGENT):
            self.last_heard, self.suspect = now, False  # it answered: alive
        if verdict == Verdict.HEARD and report is not None and report.inventory is not None:
            self.reported_digest = report.inventory.digest()
            self.changed_inventory = report.inventory
        if verdict == Verdict.HEARD and report is not None and report.engines is not None:
            await self._take_verified(report.engines)
        elif verdict == Verdict.FAILED:
            workflow.logger.warning("node %s failed its watch: %s", name, outcome.detail)
            # Within half the grace, so that the next watch still has the other half.
            pause = min(options.NODE_WATCH_RETRY_PAUSE, self._heartbeat())
            self.watch.not_before = now + pause
        elif verdict == Verdict.OLD_AGENT:
            workflow.logger.info("node %s's agent heartbeats with signals", name)
            self.signal_beats = True
        elif verdict == Verdict.SUSPECT and self._state() in LIVE and not self.suspect:
            # Heartbeated until a heartbeat timeout ago, as far as Temporal knows; probe now.
            self.last_heard = max(self.last_heard or now, now - self._heartbeat())
            self.suspect = True
        elif verdict in (Verdict.SUSPECT, Verdict.SILENT):
            # Nobody took it, or a probe was taken and never answered: the silence goes on.
            await self._lose()
        elif verdict == Verdict.FORGIVEN:
            workflow.logger.warning(
                "control plane was away for about %ds: node %s gets a fresh grace",
                int((now - (self.watch.asked_at or now) - self.watch.window).total_seconds()),
                name,
            )
            if self._state() in LIVE:
                self.last_heard = now
            elif self._state() == NodeState.UNREACHABLE:
                self.last_heard = now - self._grace()  # still unreachable, lost only later

    async def _take_verified(self, engines: list[EngineStatus]) -> None:
        """A re-verification on the node that differs from the record: record and publish it
        (only watches that asked for one can carry it: ENGINES_VERIFIED_ON_NODE)."""
        if self.view is None or not workflow.patched(ENGINES_VERIFIED_ON_NODE):
            return
        if take_verified(self.view.record.engines, VerifyEnginesResult(engines=engines)):
            await self._publish()

    async def _lose(self) -> None:
        """Count the node unreachable, or lost, once it has been silent long enough (the timer
        may also have been a drain poll, or have fired after a heartbeat arrived)."""
        live = self._state() in (NodeState.READY, NodeState.REGISTERING)
        silent = int(self._silent_for().total_seconds())
        if live and self._silent_for() >= self._grace():
            # Routes withdrawn (the ledger serves none on an unreachable node); engines and
            # allocations kept: the node may only be cut off, and come back with all of it.
            await self._set_state(NodeState.UNREACHABLE, f"no heartbeat for {silent}s")
        if self._state() == NodeState.UNREACHABLE and self._silent_for() >= self._gone_grace():
            await self._set_state(NodeState.LOST, f"no heartbeat for {silent}s")
            await self._move_replicas(f"node {self._name()} lost", False)
