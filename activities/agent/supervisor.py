"""Engine processes that outlive the agent: start, adopt, watch and stop them.

Each engine runs in its own session (so its process group holds every worker it forks, and an
agent restart or a Ctrl-C on the agent's terminal does not reach it) and writes its output
straight to a log file (so nothing breaks when the agent that started it is gone). A spec file
per replica describes the process well enough for a restarted agent to adopt it, and to refuse
a pid that has since been reused by something else.

One engine per replica, whatever the retries: every launch and stop of a replica holds its lock
(replica_lock.py: across threads, so an attempt that timed out but still runs in its
thread blocks the retry, and across agent processes). The spec is written as a "launching"
record before the process starts, naming a launch id the engine gets in its environment, and
completed with its pid right after. A launching record found later means the attempt that wrote
it died in between: its engine, if it started, is found by that id and adopted (it is exactly
what this launch would start, and killing it would only cost a load), else the record is dropped.

The spec record is activities/agent/shard_spec.py; finding and signalling an engine's processes,
engine_processes.py; its log, engine_logs.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path

from activities.agent import procfs
from activities.agent.engine_logs import LOG_TAIL_BYTES, failure_line, log_tail, open_log
from activities.agent.engine_processes import (
    LAUNCH_ID_ENV,
    describe_exit,
    launched_with,
    orphaned_workers,
    signal_group,
)
from activities.agent.replica_lock import ReplicaBusy, replica_lock
from activities.agent.shard_spec import LAUNCHING, RUNNING, ShardSpec, load_spec
from engines.adapter import KvPublisher
from workflows.contracts import EngineExit, LaunchResult, StopResult

__all__ = ["LAUNCH_ID_ENV", "ReplicaBusy", "ShardSpec", "ShardSupervisor", "describe_exit"]

_KILL_WAIT_S = 5.0
STOP_GRACE_S = 10.0


class ShardSupervisor:
    def __init__(self, shards_dir: Path, logs_dir: Path) -> None:
        self._shards_dir = shards_dir
        self._logs_dir = logs_dir
        shards_dir.mkdir(parents=True, exist_ok=True)
        logs_dir.mkdir(parents=True, exist_ok=True)
        # Processes this instance started: only these can be waited on for an exit code (and
        # must be, or they linger as zombies). Adopted ones are watched through /proc.
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    # --- spec files ----------------------------------------------------------------------

    def _spec_path(self, replica_id: str) -> Path:
        if not replica_id or "/" in replica_id or replica_id.startswith("."):
            raise ValueError(f"invalid replica id {replica_id!r}")
        return self._shards_dir / f"{replica_id}.json"

    def _lock(
        self, replica_id: str, wait_s: float | None = None
    ) -> contextlib.AbstractContextManager[None]:
        path = self._spec_path(replica_id).with_suffix(".lock")
        return replica_lock(path) if wait_s is None else replica_lock(path, wait_s)

    def log_path(self, replica_id: str) -> Path:
        self._spec_path(replica_id)  # same validation
        return self._logs_dir / f"{replica_id}.log"

    def read_spec(self, replica_id: str) -> ShardSpec | None:
        return load_spec(self._spec_path(replica_id))

    def _write_spec(self, spec: ShardSpec) -> None:
        fd, tmp = tempfile.mkstemp(dir=self._shards_dir, prefix=".spec-")
        with os.fdopen(fd, "w") as out:
            json.dump(asdict(spec), out, indent=2)
        os.replace(tmp, self._spec_path(spec.replica_id))

    def _remove_spec(self, replica_id: str) -> None:
        self._spec_path(replica_id).unlink(missing_ok=True)

    def shards(self) -> list[ShardSpec]:
        specs = (load_spec(p) for p in sorted(self._shards_dir.glob("*.json")))
        return [s for s in specs if s is not None]

    # --- liveness ------------------------------------------------------------------------

    def _reap(self, replica_id: str) -> int | None:
        """The exit code of our own child once it has exited (reaping it), else None."""
        child = self._children.get(replica_id)
        return None if child is None else child.poll()

    def _running(self, spec: ShardSpec) -> bool:
        self._reap(spec.replica_id)
        return procfs.is_same_process_running(spec.pid, spec.start_time)

    def is_alive(self, replica_id: str) -> bool:
        spec = self.read_spec(replica_id)
        return spec is not None and self._running(spec)

    def dead_shards(self) -> list[ShardSpec]:
        """Specs whose process is gone: engines that died while no agent was watching. A
        launching record whose launch is still under way (its lock held) is left alone; one
        whose launch died is settled first (adopted if its engine runs, else dropped)."""
        dead = []
        for spec in self.shards():
            if spec.launching:
                with contextlib.suppress(ReplicaBusy), self._lock(spec.replica_id, 0.0):
                    self._settle(spec)
                continue
            if not self._running(spec):
                dead.append(spec)
        return dead

    def log_tail(self, replica_id: str, max_bytes: int = LOG_TAIL_BYTES) -> str:
        return log_tail(self.log_path(replica_id), max_bytes)

    def failure_line(self, replica_id: str) -> str:
        """One redacted line on why the engine's latest run failed (engine_logs.py)."""
        return failure_line(self.log_path(replica_id))

    # --- launch --------------------------------------------------------------------------

    def launch(
        self,
        replica_id: str,
        workflow_id: str,
        command: list[str],
        env: dict[str, str],
        fingerprint: str,
        port: int,
        gpu_uuids: list[str] | None = None,
        before_start: Callable[[], None] | None = None,
        engine: str = "",
        kv_publisher: KvPublisher | None = None,
        restart_fingerprint: str = "",
        adapters: Mapping[str, str] | None = None,
    ) -> LaunchResult:
        """Start the engine, or adopt the one already running for this replica when it serves
        the same profile on the same port. Calling it twice, at once or one after the other,
        from two threads or two agents, never runs two engines. An adopted engine keeps the
        KvPublisher its spec recorded when it was started.

        `restart_fingerprint` is given only for an engine that loads adapters while it runs: a
        running engine whose recorded one is equal (and not empty) serves the same profile but
        for its adapters, and is adopted too. Its spec then records `adapters` (the shard's
        list; None on a shard whose engine does not load them itself) as pending, for the
        caller to load (adapters_served records them loaded).

        A shard of several processes (sidecars, then the engine) is one `command` too: the
        shard launcher, which leads the process group they all share.

        `before_start` runs under the lock only when a process is about to start (not on an
        adoption): a check that may refuse the start by raising.

        Raises ReplicaBusy when another launch or stop of the replica holds it too long."""
        with self._lock(replica_id):
            existing = self.read_spec(replica_id)
            if existing is not None and existing.launching:
                existing = self._settle(existing)
            if existing is not None:
                if existing.port == port and self._running(existing):
                    adopted = self._adopt(existing, fingerprint, restart_fingerprint, adapters)
                    if adopted is not None:
                        return adopted
                # An old profile: replace it rather than run both. A dead one: workers it
                # forked may outlive it, holding memory the new engine needs.
                self._stop_locked(existing, STOP_GRACE_S)
            if before_start is not None:
                before_start()
            return self._start(
                replica_id,
                workflow_id,
                command,
                env,
                fingerprint,
                port,
                list(gpu_uuids or []),
                engine,
                kv_publisher,
                restart_fingerprint,
            )

    def _adopt(
        self,
        spec: ShardSpec,
        fingerprint: str,
        restart_fingerprint: str,
        adapters: Mapping[str, str] | None,
    ) -> LaunchResult | None:
        """Adopt the running engine `spec` records (the caller holds the lock) when it serves
        this profile, or this profile but for its adapters; None when it serves another."""
        adopted = LaunchResult(pid=spec.pid, adopted=True, command=spec.command)
        if spec.fingerprint == fingerprint and spec.pending_adapters is None:
            return adopted
        restart = restart_fingerprint
        only_adapters = bool(restart) and spec.restart_fingerprint == restart
        if spec.fingerprint != fingerprint and not only_adapters:
            return None
        if adapters is None:
            # Nothing to load here (a worker shard: its leader's engine loads them).
            served = replace(spec, pending_adapters=None, pending_fingerprint="")
            self._write_spec(replace(served, fingerprint=fingerprint))
        else:
            self._write_spec(
                replace(spec, pending_adapters=dict(adapters), pending_fingerprint=fingerprint)
            )
        return adopted

    def adapters_served(self, replica_id: str, pid: int, served: Mapping[str, str]) -> None:
        """Record that the engine `pid` of the replica now serves exactly `served` (name ->
        path on this node): its KvPublisher's adapters (what the gateway hashes an adapter's
        blocks with), and, when they are the ones its adoption left pending, the fingerprint
        it was adopted for. A spec of another process, or none, is left as it is."""
        with self._lock(replica_id):
            spec = self.read_spec(replica_id)
            if spec is None or spec.launching or spec.pid != pid:
                return
            updated = spec
            if isinstance(spec.kv_publisher, dict):
                listed = [[name, path] for name, path in served.items()]
                updated = replace(updated, kv_publisher={**spec.kv_publisher, "adapters": listed})
            if spec.pending_adapters is not None and spec.pending_adapters == dict(served):
                updated = replace(
                    updated,
                    fingerprint=spec.pending_fingerprint or spec.fingerprint,
                    pending_adapters=None,
                    pending_fingerprint="",
                )
            if updated != spec:
                self._write_spec(updated)

    def _settle(self, spec: ShardSpec) -> ShardSpec | None:
        """A launching record whose launch ended (the caller holds the lock) before the pid was
        recorded: the engine it started, found by its launch id and recorded; or None, with the
        record dropped, when nothing started (workers of a leader that died are killed)."""
        procs = launched_with(spec.launch_id) if spec.launch_id else []
        leader = next((p for p in procs if p.pid == p.pgrp), None)
        if leader is not None:
            found = replace(spec, pid=leader.pid, start_time=leader.start_time, phase=RUNNING)
            self._write_spec(found)
            return found
        for pgid in {p.pgrp for p in procs}:
            signal_group(pgid, signal.SIGKILL)
        self._remove_spec(spec.replica_id)
        return None

    def _start(
        self,
        replica_id: str,
        workflow_id: str,
        command: list[str],
        env: dict[str, str],
        fingerprint: str,
        port: int,
        gpu_uuids: list[str],
        engine: str,
        kv_publisher: KvPublisher | None,
        restart_fingerprint: str,
    ) -> LaunchResult:
        launching = ShardSpec(
            replica_id=replica_id,
            workflow_id=workflow_id,
            pid=0,
            start_time=0,
            command=list(command),
            fingerprint=fingerprint,
            port=port,
            log_path=str(self.log_path(replica_id)),
            gpu_uuids=gpu_uuids,
            phase=LAUNCHING,
            launch_id=uuid.uuid4().hex,
            engine=engine,
            kv_publisher=None if kv_publisher is None else asdict(kv_publisher),
            restart_fingerprint=restart_fingerprint,
        )
        # On disk before the process exists: an agent that dies from here on leaves a record
        # the next launch settles, never an engine nobody knows of.
        self._write_spec(launching)
        log_fd = open_log(self.log_path(replica_id), command)
        try:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=subprocess.STDOUT,
                env={**env, LAUNCH_ID_ENV: launching.launch_id},
                start_new_session=True,
            )
        except BaseException:
            self._remove_spec(replica_id)  # nothing started
            raise
        finally:
            os.close(log_fd)
        self._children[replica_id] = proc
        started = procfs.start_time(proc.pid)
        if started is None:  # gone between exec and here; still recorded so its exit is seen
            started = -1
        self._write_spec(
            replace(
                launching,
                pid=proc.pid,
                start_time=started,
                started_at=datetime.now(UTC).isoformat(timespec="seconds"),
                phase=RUNNING,
            )
        )
        return LaunchResult(pid=proc.pid, adopted=False, command=list(command))

    # --- watch ---------------------------------------------------------------------------

    def _ended(self, spec: ShardSpec, code: int | None, how: str = "") -> EngineExit:
        """What the replica workflow is told: the exit and, unless it exited cleanly, one
        redacted line of its log. The log itself stays on this node (its path is in the spec):
        engine output can hold prompts, and this goes into workflow history."""
        reason = f"engine process {spec.pid} {how or describe_exit(code)}"
        if code != 0:
            line = self.failure_line(spec.replica_id)
            if line:
                reason += f": {line}"
        return EngineExit(replica_id=spec.replica_id, exit_code=code, reason=reason)

    def ended_unwatched(self, spec: ShardSpec) -> EngineExit:
        """For an engine found dead at boot: not our child, so its exit code is unknowable."""
        return self._ended(spec, None, "ended while the agent was not running")

    def _exit_of(self, spec: ShardSpec) -> EngineExit | None:
        """EngineExit when the process has ended, None while it runs."""
        child = self._children.get(spec.replica_id)
        if child is not None and child.pid == spec.pid:
            code = child.poll()
            if code is None:
                return None
        elif procfs.is_same_process_running(spec.pid, spec.start_time):
            return None
        else:
            code = None
        return self._ended(spec, code)

    async def wait_exit(
        self, replica_id: str, heartbeat: Callable[[], None], poll_s: float = 1.0
    ) -> EngineExit:
        """Return once the replica's engine has ended (at once when none is running)."""
        spec = self.read_spec(replica_id)
        if spec is None or spec.launching:
            # A launching record: the launch that wrote it did not return, so nothing here
            # watches an engine the replica was told of.
            return EngineExit(
                replica_id=replica_id, reason="no engine process is recorded for this replica"
            )
        while True:
            heartbeat()
            ended = self._exit_of(spec)
            if ended is not None:
                return ended
            await asyncio.sleep(poll_s)

    # --- stop ----------------------------------------------------------------------------

    def _wait_group_gone(self, spec: ShardSpec, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            self._reap(spec.replica_id)
            if not procfs.group_members(spec.pid):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def stop(self, replica_id: str, grace_s: float = STOP_GRACE_S) -> StopResult:
        """SIGTERM the engine's whole process group, SIGKILL what is left after `grace_s`."""
        with self._lock(replica_id, grace_s + _KILL_WAIT_S + 30.0):
            spec = self.read_spec(replica_id)
            if spec is not None and spec.launching:
                spec = self._settle(spec)
            if spec is None:
                return StopResult(replica_id=replica_id, was_running=False)
            return self._stop_locked(spec, grace_s)

    def _stop_locked(self, spec: ShardSpec, grace_s: float) -> StopResult:
        replica_id = spec.replica_id
        # Only a process proven to be ours (pid and start time) is signalled: a reused pid
        # belongs to someone else, and its group with it.
        was_running = self._running(spec)
        if was_running:
            signal_group(spec.pid, signal.SIGTERM)
            if not self._wait_group_gone(spec, grace_s):
                signal_group(spec.pid, signal.SIGKILL)
                self._wait_group_gone(spec, _KILL_WAIT_S)
        elif orphaned_workers(spec):
            signal_group(spec.pid, signal.SIGKILL)
            self._wait_group_gone(spec, _KILL_WAIT_S)
        self._children.pop(replica_id, None)
        self._remove_spec(replica_id)
        return StopResult(replica_id=replica_id, was_running=was_running)

    def stop_all(self, grace_s: float = STOP_GRACE_S) -> list[StopResult]:
        return [self.stop(spec.replica_id, grace_s) for spec in self.shards()]
