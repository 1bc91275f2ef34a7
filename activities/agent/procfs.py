"""What /proc says about a process: state, start time, process group. Linux only.

A pid alone does not identify a process: pids are reused. (pid, start time) does, because the
start time (clock ticks since boot, /proc/<pid>/stat field 22) never repeats for one pid.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str
    ppid: int
    pgrp: int
    start_time: int

    @property
    def running(self) -> bool:
        # A zombie has exited and only waits to be reaped; X is dead outright.
        return self.state not in ("Z", "X", "x")


def parse_stat(text: str) -> ProcStat:
    """Parse one /proc/<pid>/stat line. The command name (field 2) may contain spaces and
    parentheses, so fields are counted from the last ')'."""
    head, _, rest = text.rpartition(")")
    pid = int(head.split("(", 1)[0])
    fields = rest.split()
    # fields[0] is field 3 (state); field N is fields[N - 3].
    return ProcStat(
        pid=pid,
        state=fields[0],
        ppid=int(fields[1]),
        pgrp=int(fields[2]),
        start_time=int(fields[19]),
    )


def read_stat(pid: int) -> ProcStat | None:
    try:
        return parse_stat((PROC / str(pid) / "stat").read_text())
    except (OSError, ValueError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    stat = read_stat(pid)
    return stat.start_time if stat else None


def is_same_process_running(pid: int, expected_start_time: int) -> bool:
    """True when `pid` is still the process that started at `expected_start_time` and has not
    exited; a reused pid or a zombie is False."""
    stat = read_stat(pid)
    return stat is not None and stat.running and stat.start_time == expected_start_time


def live_processes() -> list[ProcStat]:
    """Every process not yet ended, as /proc lists them now."""
    found: list[ProcStat] = []
    for entry in os.scandir(PROC):
        if entry.name.isdigit():
            stat = read_stat(int(entry.name))
            if stat is not None and stat.running:
                found.append(stat)
    return found


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group `pgid`: an engine's leader may be gone while
    workers it forked still hold memory or GPUs."""
    return [stat.pid for stat in live_processes() if stat.pgrp == pgid]


PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes(pid: int) -> int | None:
    """Resident memory of one process (/proc/<pid>/statm, field 2, in pages); None once gone.
    Pages it shares with another process (a file both map) count in each."""
    try:
        resident = int((PROC / str(pid) / "statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return resident * PAGE_SIZE
