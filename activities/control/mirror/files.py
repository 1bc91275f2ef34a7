"""Writing into the mirror's tmp/: every byte passes through `write_all`, so a full disk is one
clear message wherever it happens (and tests can make the disk full by replacing it)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import BinaryIO

from activities.control.mirror.errors import MirrorError

# Out of space, or out of the user's quota: both mean "free some space and try again".
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def write_all(f: BinaryIO, data: bytes) -> None:
    """All of `data`, also to an unbuffered file, whose write may take only part of it."""
    view = memoryview(data)
    while view:
        view = view[f.write(view) :]


def disk_full_error(err: OSError, where: Path, what: str) -> MirrorError | None:
    """The operator's message for a full disk, or None when `err` is some other failure."""
    if err.errno not in DISK_FULL:
        return None
    return MirrorError(f"no space left on the mirror's disk ({where}) while writing {what}")


def sync_dir(path: Path) -> None:
    """Make a rename in `path` durable: without it a crash can lose a blob just renamed."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
