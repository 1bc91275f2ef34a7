"""Unpack a tar archive refusing anything that would land or point outside the target.

Archives come from the network; a member named `../../etc/cron.d/x`, an absolute path, or a
link aimed outside the directory must fail the install, not write where it points. Every
member is checked before anything is written, so a refused archive leaves nothing behind.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path, PurePosixPath


class UnsafeArchiveError(ValueError):
    """The archive tried to write or link outside the directory it is unpacked into."""


def _inside(root: Path, candidate: Path) -> bool:
    return candidate == root or root in candidate.parents


def _check_member(member: tarfile.TarInfo, root: Path) -> None:
    name = PurePosixPath(member.name)
    if name.is_absolute():
        raise UnsafeArchiveError(f"absolute path in archive: {member.name}")
    if ".." in name.parts:
        raise UnsafeArchiveError(f"path leaves the target: {member.name}")
    destination = Path(os.path.normpath(root / name))
    if not _inside(root, destination):
        raise UnsafeArchiveError(f"path leaves the target: {member.name}")
    if member.issym():
        link = PurePosixPath(member.linkname)
        # A relative symlink resolves from the directory holding it.
        target = root / link if link.is_absolute() else destination.parent / link
        if link.is_absolute() or not _inside(root, Path(os.path.normpath(target))):
            raise UnsafeArchiveError(f"symlink {member.name} points outside: {member.linkname}")
    elif member.islnk():
        # A hard link's target is named relative to the archive root.
        target = Path(os.path.normpath(root / member.linkname))
        if PurePosixPath(member.linkname).is_absolute() or not _inside(root, target):
            raise UnsafeArchiveError(f"hardlink {member.name} points outside: {member.linkname}")
    elif not (member.isfile() or member.isdir()):
        raise UnsafeArchiveError(f"device or fifo in archive: {member.name}")


def safe_extract(archive: Path, target: Path) -> list[str]:
    """Extract `archive` (any compression tarfile reads) into `target`; returns member names."""
    target.mkdir(parents=True, exist_ok=True)
    root = Path(os.path.realpath(target))
    with tarfile.open(archive, "r:*") as tar:
        members = tar.getmembers()
        for member in members:
            _check_member(member, root)
        # The "data" filter re-checks at write time (links through links created earlier in the
        # same archive) and drops setuid bits and ownership the archive claims.
        tar.extractall(root, members=members, filter="data")
    return [m.name for m in members]
