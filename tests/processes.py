"""Finding processes by a token on their command line, for tests of engine processes."""

import os
import time
from pathlib import Path

from activities.agent import procfs

# How long a child of this process may take to finish its exec.
EXEC_SETTLES_S = 5.0


def pids_with_token(token: str) -> list[int]:
    """Live (not zombie) processes whose command line holds `token`, sorted."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        cmdline = command_line(pid)
        stat = procfs.read_stat(pid)
        if token.encode() in cmdline and stat is not None and stat.running:
            found.append(pid)
    return sorted(found)


def command_line(pid: int) -> bytes:
    """/proc/<pid>/cmdline, waiting out a child of this process still inside execve.

    subprocess.Popen returns once the child's close-on-exec pipe closes, which the kernel does
    partway through execve: before the new program's arguments are in place, its command line
    reads empty. Seen under load: a just-launched engine missing from the count. A kernel
    thread's command line is empty too, but no kernel thread is a child of this process."""
    deadline = time.monotonic() + EXEC_SETTLES_S
    while True:
        try:
            cmdline = (Path("/proc") / str(pid) / "cmdline").read_bytes()
        except OSError:
            return b""
        stat = procfs.read_stat(pid)
        own_child = stat is not None and stat.running and stat.ppid == os.getpid()
        if cmdline or not own_child or time.monotonic() > deadline:
            return cmdline
        time.sleep(0.01)
