"""Versioned engine directories: `engines_root/<engine>/<version>/` with an `installed.json`
marker written only after the binary was verified.

A directory without the marker is a half-finished or failed install and never counts.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

MARKER = "installed.json"


@dataclass(frozen=True)
class Marker:
    engine: str
    version: str
    binary: str
    detail: str
    installed_at: str


def engine_dir(engines_root: Path, engine: str, version: str) -> Path:
    return engines_root / engine / version


def read_marker(directory: Path) -> Marker | None:
    try:
        raw = json.loads((directory / MARKER).read_text())
        return Marker(
            engine=str(raw["engine"]),
            version=str(raw["version"]),
            binary=str(raw["binary"]),
            detail=str(raw.get("detail", "")),
            installed_at=str(raw.get("installed_at", "")),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_marker(directory: Path, engine: str, version: str, binary: str, detail: str) -> Marker:
    marker = Marker(
        engine=engine,
        version=version,
        binary=binary,
        detail=detail,
        installed_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    # Written beside and renamed into place, so a crash never leaves a marker half written.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".marker-")
    with os.fdopen(fd, "w") as out:
        json.dump(marker.__dict__, out, indent=2)
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide it from an operator's tools
    os.replace(tmp, directory / MARKER)
    return marker


def remove_marker(directory: Path) -> None:
    (directory / MARKER).unlink(missing_ok=True)


def version_dirs(engines_root: Path) -> Iterator[tuple[str, Path, Marker | None]]:
    """Every `<engine>/<version>/` directory under `engines_root`, with its marker (None: an
    install that did not finish); dot-prefixed staging directories and lock files left out."""
    engine_dirs = sorted(engines_root.iterdir()) if engines_root.is_dir() else []
    for engine_dir in engine_dirs:
        if not engine_dir.is_dir() or engine_dir.name.startswith("."):
            continue
        for version_dir in sorted(engine_dir.iterdir()):
            if version_dir.is_dir() and not version_dir.name.startswith("."):
                yield engine_dir.name, version_dir, read_marker(version_dir)


def installed_binary(engines_root: Path, engine: str, version: str) -> Path | None:
    """The verified binary of engine@version, or None when it is not (completely) installed."""
    directory = engine_dir(engines_root, engine, version)
    marker = read_marker(directory)
    if marker is None:
        return None
    binary = directory / marker.binary
    return binary if binary.is_file() else None


def place(dist: Path, destination: Path) -> None:
    """Copy `dist` to `destination` through a temporary sibling and one rename, so nothing ever
    sees a partly copied engine directory. A previous unmarked directory is replaced."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=destination.parent, prefix=f".{destination.name}-"))
    try:
        staging.chmod(0o755)  # mkdtemp's 0700 would hide the engine from the operator's tools
        shutil.copytree(dist, staging, dirs_exist_ok=True)
        if destination.exists():
            shutil.rmtree(destination)
        os.rename(staging, destination)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


@contextmanager
def exclusive(lock_file: Path) -> Iterator[None]:
    """Hold a lock file while installing one engine version: two installs of one version on
    one node (a retried activity racing its predecessor's thread) would build into the same
    tree; the second waits and then finds the first one's result."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with lock_file.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
