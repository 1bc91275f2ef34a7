"""An engine's processes as the supervisor finds and ends them (activities/agent/supervisor.py):
by the launch id in their environment, by their process group, and how an exit reads.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from activities.agent import procfs
from activities.agent.shard_spec import ShardSpec

# Every engine gets its launch's id here: how a launch that died before recording the pid finds
# the process it started. Not a secret; unique per launch.
LAUNCH_ID_ENV = "LLMGW_LAUNCH_ID"


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


def launched_with(launch_id: str) -> list[procfs.ProcStat]:
    """Live processes whose environment carries this launch id: the engine and its workers."""
    mark = f"{LAUNCH_ID_ENV}={launch_id}".encode()
    found = []
    for entry in os.scandir(procfs.PROC):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
        except OSError:
            continue
        if mark in environ.split(b"\0"):
            stat = procfs.read_stat(int(entry.name))
            if stat is not None and stat.running:
                found.append(stat)
    return found


def describe_exit(code: int | None) -> str:
    if code is None:
        return "exited (exit code unknown: not a child of this agent)"
    if code < 0:
        return f"killed by {_signal_name(-code)}"
    return f"exited with code {code}"


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def orphaned_workers(spec: ShardSpec) -> bool:
    """The leader died but processes it forked still run in its group. The kernel never
    hands out a pid still in use as a process group id, so while no other process holds
    the leader's pid, that group is still the engine's."""
    if spec.pid <= 0:
        return False
    leader = procfs.read_stat(spec.pid)
    if leader is not None and leader.start_time != spec.start_time:
        return False
    return bool(procfs.group_members(spec.pid))
