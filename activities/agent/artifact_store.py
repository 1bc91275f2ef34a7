"""A node's store of fetched artifacts, under `<agent state_dir>/artifacts/`:

    blobs/sha256/<hex>        verified blobs, read-only (artifacts hard-link them)
    .partial/<hex>            a blob being downloaded; resumed from its size after any stop
    .locks/<hex>.lock         flocks: one fetch of a blob, one assembly of an artifact at a time
    <manifest hex>/<path>     an artifact's files under their manifest paths
    <manifest hex>/.complete  written before the directory is renamed into place

An artifact's directory only ever appears whole: it is built in a temporary directory beside it
and renamed, with its marker already inside. Locks are flocks (see replica_lock.py for why) and
are never removed; the kernel drops them when a killed agent dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

from workflows.artifact_names import (
    COMPLETE_MARKER,
    SHA256,
    BadArtifact,
    artifact_hint,
    blob_relpath,
    check_relative_path,
    hex_of,
)
from workflows.contracts import ArtifactManifest

# The agent starts an engine on an artifact only once this is there (node_agent.py).
MARKER = COMPLETE_MARKER
_HEX = re.compile(r"^[0-9a-f]{64}$")
# At most this many artifacts in a node's inventory, each by its short hint (23 bytes): they
# travel in every node's record of the ledger's state (1,000 nodes: 368 KB at most before the
# state is packed), and a node rarely runs more models than that.
REPORTED_ARTIFACTS = 16
_POLL_S = 0.1


class FetchStopped(Exception):
    """The fetch was asked to stop (its activity was cancelled) while it waited or copied."""


class ArtifactStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def blob(self, digest: str) -> Path:
        return self.root / blob_relpath(digest)

    def partial(self, digest: str) -> Path:
        return self.root / ".partial" / hex_of(digest)

    def artifact_dir(self, manifest_digest: str) -> Path:
        return self.root / hex_of(manifest_digest)

    def is_complete(self, manifest_digest: str) -> bool:
        return (self.artifact_dir(manifest_digest) / MARKER).is_file()

    def complete(self, limit: int = REPORTED_ARTIFACTS) -> list[str]:
        """The artifacts held whole, the `limit` most recently fetched, by their hints
        (artifact_names.artifact_hint), sorted: what discovery reports, so placement prefers
        this node for models whose weights are here."""
        if not self.root.is_dir():
            return []
        held = [
            ((entry / MARKER).stat().st_mtime, entry.name)
            for entry in self.root.iterdir()
            if _HEX.match(entry.name) and (entry / MARKER).is_file()
        ]
        newest = sorted(held, reverse=True)[:limit]
        return sorted(artifact_hint(SHA256 + name) for _, name in newest)

    def disk_free_mb(self) -> int | None:
        """Free space for fetches, in MB (10**6 bytes, as placement reads it): where the store
        is, or would be made (its nearest existing parent, before the first fetch), as an
        unprivileged process may use it, rounded down to two significant figures. None when it
        cannot be read."""
        where = self.root
        while not where.exists() and where != where.parent:
            where = where.parent
        try:
            stat = os.statvfs(where)
        except OSError:
            return None
        return two_figures(stat.f_bavail * stat.f_frsize // 1_000_000)

    def prepare(self) -> None:
        for sub in ("blobs/sha256", ".partial", ".locks"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def lock(self, digest: str, stop: threading.Event) -> Iterator[None]:
        """Hold the flock of one blob or artifact (by digest), waiting for another fetch of it
        to end, however long that takes, unless `stop` is set."""
        fd = os.open(self.root / ".locks" / f"{hex_of(digest)}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if stop.wait(_POLL_S):
                        raise FetchStopped("stopped while another fetch held the lock") from None
            yield
        finally:
            os.close(fd)  # releases the lock

    def assemble(self, manifest_digest: str, manifest: ArtifactManifest) -> Path:
        """Lay the artifact's files out as hard links to its verified blobs (copies where the
        file system refuses links) and rename the directory into place. The caller holds the
        artifact's lock and has every blob."""
        final = self.artifact_dir(manifest_digest)
        # What an assembly killed before its rename left: nobody else builds under this lock.
        for stale in self.root.glob(f".tmp-{hex_of(manifest_digest)}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        building = self.root / f".tmp-{hex_of(manifest_digest)}-{uuid.uuid4().hex[:8]}"
        building.mkdir()
        try:
            for file in manifest.files:
                target = building / check_relative_path(file.path)
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(self.blob(file.digest), target)
                except OSError:
                    shutil.copyfile(self.blob(file.digest), target)
            marker = building / MARKER
            marker.write_text(manifest.model_dump_json() + "\n")
            _fsync_file(marker)
            if final.exists():
                # Left by something other than this code (a rename is whole): nothing to keep.
                shutil.rmtree(final)
            os.rename(building, final)
            _fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(building, ignore_errors=True)
            raise
        return final


def two_figures(value: int) -> int:
    """`value` rounded down to two significant figures (1234 -> 1200, 98765 -> 98000). The
    agent publishes its inventory again only when it changes: free space reported to the MB
    would change with every log line written; this changes when a real share of it does, and
    is never more than the truth."""
    step: int = 10 ** max(len(str(value)) - 2, 0)
    return value - value % step


def check_layout(manifest: ArtifactManifest) -> None:
    """Refuse a manifest whose files cannot be laid out safely: a path that could escape the
    artifact's directory, one that collides with the marker, or one that is both a file and
    another file's directory."""
    files: set[str] = set()
    dirs: set[str] = set()
    for file in manifest.files:
        path = check_relative_path(file.path)
        hex_of(file.digest)
        if path == MARKER:
            raise BadArtifact(f"an artifact file may not be named {MARKER!r}")
        parents = {path.rsplit("/", n)[0] for n in range(1, path.count("/") + 1)}
        if path in files or path in dirs or parents & files:
            raise BadArtifact(f"{path!r} collides with another file of the artifact")
        files.add(path)
        dirs |= parents


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    # A rename is durable only once its directory is: after a power loss the file is where the
    # rename put it, or where it was.
    _fsync_file(path)


def seal_blob(partial: Path, blob: Path) -> None:
    """Move a verified partial to its blob's place, read-only: the artifacts' hard links share
    its inode, so an engine writing into one of its files would corrupt every artifact."""
    _fsync_file(partial)
    partial.chmod(0o444)
    os.replace(partial, blob)
    _fsync_dir(blob.parent)
