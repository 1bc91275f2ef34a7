"""Engine processes that outlive the agent: start, adopt, watch and stop them.

Each engine runs in its own session (so its process group holds every worker it forks, and an
agent restart or a Ctrl-C on the agent's terminal does not reach it) and writes its output
straight to a log file (so nothing breaks when the agent that started it is gone). A spec file
per replica describes the process well enough for a restarted agent to adopt it, and to refuse
a pid that has since been reused by something else.
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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from activities import procfs
from workflows.contracts import EngineExit, LaunchResult, StopResult

LOG_TAIL_BYTES = 4096
# An engine's log is rotated once at (re)start when it has grown past this.
LOG_ROTATE_BYTES = 16 * 1024 * 1024
_KILL_WAIT_S = 5.0


@dataclass(frozen=True)
class ShardSpec:
    replica_id: str
    workflow_id: str
    pid: int
    # /proc/<pid>/stat field 22: with the pid, the process's identity.
    start_time: int
    command: list[str]
    fingerprint: str
    port: int
    log_path: str
    started_at: str = ""
    # The GPUs placement gave the shard: readiness checks each holds memory of its processes.
    gpu_uuids: list[str] = field(default_factory=list)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


def describe_exit(code: int | None) -> str:
    if code is None:
        return "exited (exit code unknown: not a child of this agent)"
    if code < 0:
        return f"killed by {_signal_name(-code)}"
    return f"exited with code {code}"


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

    def log_path(self, replica_id: str) -> Path:
        self._spec_path(replica_id)  # same validation
        return self._logs_dir / f"{replica_id}.log"

    def read_spec(self, replica_id: str) -> ShardSpec | None:
        return self._load(self._spec_path(replica_id))

    @staticmethod
    def _load(path: Path) -> ShardSpec | None:
        try:
            return ShardSpec(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def _write_spec(self, spec: ShardSpec) -> None:
        fd, tmp = tempfile.mkstemp(dir=self._shards_dir, prefix=".spec-")
        with os.fdopen(fd, "w") as out:
            json.dump(asdict(spec), out, indent=2)
        os.replace(tmp, self._spec_path(spec.replica_id))

    def _remove_spec(self, replica_id: str) -> None:
        self._spec_path(replica_id).unlink(missing_ok=True)

    def shards(self) -> list[ShardSpec]:
        specs = (self._load(p) for p in sorted(self._shards_dir.glob("*.json")))
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
        """Specs whose process is gone: engines that died while no agent was watching."""
        return [s for s in self.shards() if not self._running(s)]

    def log_tail(self, replica_id: str, max_bytes: int = LOG_TAIL_BYTES) -> str:
        try:
            with self.log_path(replica_id).open("rb") as log:
                log.seek(0, os.SEEK_END)
                size = log.tell()
                log.seek(max(0, size - max_bytes))
                return log.read().decode(errors="replace")
        except OSError:
            return ""

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
    ) -> LaunchResult:
        """Start the engine, or adopt the one already running for this replica when it serves
        the same profile on the same port. Calling it twice never runs two engines.

        A shard of several processes (sidecars, then the engine) is one `command` too: the
        shard launcher, which leads the process group they all share."""
        existing = self.read_spec(replica_id)
        if existing is not None:
            if self._running(existing):
                if existing.fingerprint == fingerprint and existing.port == port:
                    return LaunchResult(pid=existing.pid, adopted=True, command=existing.command)
                self.stop(replica_id)  # an old profile: replace it rather than run both
            else:
                self._remove_spec(replica_id)
        return self._start(
            replica_id, workflow_id, command, env, fingerprint, port, list(gpu_uuids or [])
        )

    def _open_log(self, replica_id: str, command: list[str]) -> int:
        path = self.log_path(replica_id)
        try:
            if path.stat().st_size > LOG_ROTATE_BYTES:
                os.replace(path, path.with_suffix(".log.1"))
        except FileNotFoundError:
            pass
        # 0600: engine output can include prompts.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        os.write(fd, f"=== llmgw {stamp}: starting {command[0]} ===\n".encode())
        return fd

    def _start(
        self,
        replica_id: str,
        workflow_id: str,
        command: list[str],
        env: dict[str, str],
        fingerprint: str,
        port: int,
        gpu_uuids: list[str],
    ) -> LaunchResult:
        log_fd = self._open_log(replica_id, command)
        try:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        finally:
            os.close(log_fd)
        self._children[replica_id] = proc
        started = procfs.start_time(proc.pid)
        if started is None:  # gone between exec and here; still recorded so its exit is seen
            started = -1
        self._write_spec(
            ShardSpec(
                replica_id=replica_id,
                workflow_id=workflow_id,
                pid=proc.pid,
                start_time=started,
                command=list(command),
                fingerprint=fingerprint,
                port=port,
                log_path=str(self.log_path(replica_id)),
                started_at=datetime.now(UTC).isoformat(timespec="seconds"),
                gpu_uuids=gpu_uuids,
            )
        )
        return LaunchResult(pid=proc.pid, adopted=False, command=list(command))

    # --- watch ---------------------------------------------------------------------------

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
        return EngineExit(
            replica_id=spec.replica_id,
            exit_code=code,
            reason=f"engine process {spec.pid} {describe_exit(code)}",
            log_tail=self.log_tail(spec.replica_id),
        )

    async def wait_exit(
        self, replica_id: str, heartbeat: Callable[[], None], poll_s: float = 1.0
    ) -> EngineExit:
        """Return once the replica's engine has ended (at once when none is running)."""
        spec = self.read_spec(replica_id)
        if spec is None:
            return EngineExit(
                replica_id=replica_id,
                reason="no engine process is recorded for this replica",
                log_tail=self.log_tail(replica_id),
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

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)

    @staticmethod
    def _orphaned_workers(spec: ShardSpec) -> bool:
        """The leader died but processes it forked still run in its group. The kernel never
        hands out a pid still in use as a process group id, so while no other process holds
        the leader's pid, that group is still the engine's."""
        leader = procfs.read_stat(spec.pid)
        if leader is not None and leader.start_time != spec.start_time:
            return False
        return bool(procfs.group_members(spec.pid))

    def stop(self, replica_id: str, grace_s: float = 10.0) -> StopResult:
        """SIGTERM the engine's whole process group, SIGKILL what is left after `grace_s`."""
        spec = self.read_spec(replica_id)
        if spec is None:
            return StopResult(replica_id=replica_id, was_running=False)
        # Only a process proven to be ours (pid and start time) is signalled: a reused pid
        # belongs to someone else, and its group with it.
        was_running = self._running(spec)
        if was_running:
            self._signal_group(spec.pid, signal.SIGTERM)
            if not self._wait_group_gone(spec, grace_s):
                self._signal_group(spec.pid, signal.SIGKILL)
                self._wait_group_gone(spec, _KILL_WAIT_S)
        elif self._orphaned_workers(spec):
            self._signal_group(spec.pid, signal.SIGKILL)
            self._wait_group_gone(spec, _KILL_WAIT_S)
        self._children.pop(replica_id, None)
        self._remove_spec(replica_id)
        return StopResult(replica_id=replica_id, was_running=was_running)

    def stop_all(self, grace_s: float = 10.0) -> list[StopResult]:
        return [self.stop(spec.replica_id, grace_s) for spec in self.shards()]
