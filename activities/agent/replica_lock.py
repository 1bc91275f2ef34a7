"""One launch or stop of a replica's engine at a time on this node, across threads and agent
processes: an exclusive flock on a file beside the replica's spec.

flock (not lockf/fcntl record locks) because its locks belong to the open file, not to the
process: two threads of one agent conflict just as two agents do. The kernel drops the lock
when its holder dies, so a killed agent never leaves a replica locked. Lock files are never
removed: unlinking one while another opener waits on it would let two holders in at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

# A launch holds the lock for a Popen and two small writes; a stop for its grace and a kill.
LOCK_WAIT_S = 60.0
_POLL_S = 0.05


class ReplicaBusy(RuntimeError):
    """Another launch or stop of the replica held its lock past the wait: retry later."""


@contextlib.contextmanager
def replica_lock(path: Path, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise ReplicaBusy(
                        f"another launch or stop of {path.stem} held its lock for {wait_s:.0f} s"
                    ) from None
                time.sleep(_POLL_S)
        yield
    finally:
        os.close(fd)  # releases the lock
