"""A local file or directory as an artifact's files: which files, under which relative paths,
and opening each one safely.

A directory's regular files are taken, walked without following links; a link is taken only
when it resolves to a regular file inside the directory (a checkout's deduplicated weights),
and refused otherwise, naming it, as are devices, FIFOs and sockets. Every relative path must
pass check_relative_path. A single file is taken under its own name (a link to it is fine: the
operator named it)."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from activities.control.mirror.errors import MirrorError
from workflows.artifact_names import BadArtifact, check_relative_path

MAX_FILES = 10_000


@dataclass(frozen=True)
class LocalFile:
    path: str  # inside the artifact
    real: Path  # on disk, links resolved


def local_files(given: str) -> list[LocalFile]:
    """The files `given` names, sorted by artifact path."""
    top = Path(given).expanduser()
    try:
        real_top = top.resolve(strict=True)
    except FileNotFoundError:
        raise MirrorError(f"{given}: no such file or directory") from None
    except (OSError, RuntimeError) as err:
        raise MirrorError(f"{given}: {err}") from None
    if real_top.is_file():
        return [LocalFile(_artifact_path(top.name), real_top)]
    if not real_top.is_dir():
        raise MirrorError(f"{given} is neither a regular file nor a directory: refused")
    found = [_one(real_top, Path(d) / name) for d, _, names in os.walk(real_top) for name in names]
    # os.walk lists links to directories among the directories and does not enter them.
    for d, dirs, _ in os.walk(real_top):
        for name in dirs:
            if (Path(d) / name).is_symlink():
                raise MirrorError(f"{Path(d) / name} is a link to a directory: refused")
    if not found:
        raise MirrorError(f"{given} holds no files")
    if len(found) > MAX_FILES:
        raise MirrorError(f"{given} holds more than {MAX_FILES} files: not one model")
    return sorted(found, key=lambda f: f.path)


def _artifact_path(path: str) -> str:
    try:
        return check_relative_path(path)
    except BadArtifact as err:
        raise MirrorError(
            f"{err} (rename the file: a mirrored name takes letters, digits, ._+-)"
        ) from None


def _one(top: Path, path: Path) -> LocalFile:
    rel = path.relative_to(top).as_posix()
    real = path.resolve()
    if path.is_symlink() and not real.is_relative_to(top):
        raise MirrorError(f"{path} is a link to {real}, outside {top}: refused")
    try:
        mode = real.stat().st_mode
    except OSError as err:
        raise MirrorError(f"{path}: {err.strerror}") from None
    if not stat.S_ISREG(mode):
        raise MirrorError(f"{path} is not a regular file (a device, FIFO or socket): refused")
    return LocalFile(_artifact_path(rel), real)


def open_regular(path: Path) -> tuple[BinaryIO, int]:
    """The file open for reading, and its size; refused unless it is still a regular file
    (O_NONBLOCK: a FIFO put in its place is refused here rather than waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise MirrorError(f"{path}: {err.strerror}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise MirrorError(f"{path} is not a regular file: refused")
    return os.fdopen(fd, "rb"), info.st_size
