"""Unpack a tar or zip archive refusing anything that would land or point outside the target.

Archives come from the network; a member named `../../etc/cron.d/x`, an absolute path, or a
link aimed outside the directory must fail the install, not write where it points. Every
member is checked before anything is written, so a refused archive leaves nothing behind.
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
import zipfile
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
    """Extract `archive` (a zip, or a tar in any compression tarfile reads) into `target`;
    returns the member names."""
    target.mkdir(parents=True, exist_ok=True)
    root = Path(os.path.realpath(target))
    if zipfile.is_zipfile(archive):
        return _extract_zip(archive, root)
    with tarfile.open(archive, "r:*") as tar:
        members = tar.getmembers()
        for member in members:
            _check_member(member, root)
        # The "data" filter re-checks at write time (links through links created earlier in the
        # same archive) and drops setuid bits and ownership the archive claims.
        tar.extractall(root, members=members, filter="data")
    return [m.name for m in members]


def _zip_mode(info: zipfile.ZipInfo) -> int:
    """The Unix mode a zip made on Unix records in the high half of external_attr (0: none)."""
    return (info.external_attr >> 16) & 0xFFFF


def _check_zip_name(name: str, root: Path) -> Path:
    # Zips made on Windows may separate with backslashes, and "C:" roots a path there.
    posix = PurePosixPath(name.replace("\\", "/"))
    if posix.is_absolute() or (posix.parts and posix.parts[0].endswith(":")):
        raise UnsafeArchiveError(f"absolute path in archive: {name}")
    if ".." in posix.parts:
        raise UnsafeArchiveError(f"path leaves the target: {name}")
    destination = Path(os.path.normpath(root / posix))
    if not _inside(root, destination):
        raise UnsafeArchiveError(f"path leaves the target: {name}")
    return destination


def _extract_zip(archive: Path, root: Path) -> list[str]:
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        links: dict[str, str] = {}
        for info in infos:
            destination = _check_zip_name(info.filename, root)
            mode = _zip_mode(info)
            if stat.S_ISLNK(mode):
                # A symlink's target is the member's content (Info-ZIP's convention).
                link = zf.read(info).decode("utf-8", "replace")
                target = Path(os.path.normpath(destination.parent / link))
                if PurePosixPath(link).is_absolute() or not _inside(root, target):
                    raise UnsafeArchiveError(f"symlink {info.filename} points outside: {link}")
                links[info.filename] = link
            elif mode and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise UnsafeArchiveError(f"device or fifo in archive: {info.filename}")
        for info in infos:
            destination = _check_zip_name(info.filename, root)
            if info.is_dir():
                destination.mkdir(parents=True, exist_ok=True)
                continue
            destination.parent.mkdir(parents=True, exist_ok=True)
            # Links made by earlier members are real now: resolve through them, as the data
            # filter does for tar, so a chain of in-bounds links cannot lead outside.
            if not _inside(root, Path(os.path.realpath(destination.parent))):
                raise UnsafeArchiveError(f"{info.filename} would be written outside through a link")
            if info.filename in links:
                real = os.path.realpath(destination.parent / links[info.filename])
                if not _inside(root, Path(real)):
                    raise UnsafeArchiveError(
                        f"symlink {info.filename} points outside: {links[info.filename]}"
                    )
                destination.symlink_to(links[info.filename])
                continue
            # Never write through something already there (a link made by an earlier member).
            if destination.is_symlink():
                raise UnsafeArchiveError(f"{info.filename} would be written through a link")
            with zf.open(info) as src, destination.open("wb") as out:
                shutil.copyfileobj(src, out)
            # Keep the executable bits, drop setuid/setgid/sticky, as tar's "data" filter does.
            destination.chmod((_zip_mode(info) & 0o777) or 0o644)
        return [info.filename for info in infos]
