"""The mirror's layout on disk and the only code that changes it.

    <root>/blobs/sha256/<hex>              verified file contents, one per digest
    <root>/manifests/sha256/<hex>.json     ArtifactManifest JSON, named by manifest_digest
    <root>/refs/<name>.json                {"manifest": "sha256:..."}: a model's or adapter's name
    <root>/tmp/                            downloads and copies in progress
    <root>/lock                            flock: adds share it, gc takes it alone

Nothing appears under blobs/, manifests/ or refs/ unverified or half-written: each file is
written in tmp/ (or beside its final name for the small JSON files), flushed, then renamed
with os.replace on the same file system. An add holds the lock shared from its first blob to
its ref, and gc holds it exclusively, so gc never removes a blob an add has just verified but
not yet listed in a manifest.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from activities.control.mirror.errors import MirrorError
from activities.control.mirror.files import sync_dir
from workflows.artifact_names import (
    BadArtifact,
    blob_relpath,
    check_digest,
    hex_of,
    manifest_digest,
)
from workflows.contracts.artifacts import ArtifactManifest

# A ref is named like a model (workflows/contracts/models.py ModelSpec.name), so the name a
# model is defined under can name its weights too.
_REF_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
MAX_JSON_BYTES = 16 << 20


def check_ref_name(name: str) -> str:
    if not _REF_NAME.match(name) or ".." in name:
        raise MirrorError(
            f"{name[:100]!r} is not a mirror name: 1 to 63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


class MirrorStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.blobs = root / "blobs" / "sha256"
        self.manifests = root / "manifests" / "sha256"
        self.refs_dir = root / "refs"
        self.tmp = root / "tmp"

    def ensure(self) -> None:
        for path in (self.blobs, self.manifests, self.refs_dir, self.tmp):
            path.mkdir(parents=True, exist_ok=True)

    # --- the lock -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self, mode: int) -> Iterator[None]:
        self.ensure()
        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, mode)
            except BlockingIOError:
                raise MirrorError(
                    "a `llmgw mirror add` is running on this mirror; run gc when it has finished"
                ) from None
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def adding(self) -> contextlib.AbstractContextManager[None]:
        """Held (shared) by an add for as long as it has blobs no manifest lists yet."""
        return self._locked(fcntl.LOCK_SH)

    def collecting(self) -> contextlib.AbstractContextManager[None]:
        """Held (alone) by gc; refused at once, not waited for, while an add runs."""
        return self._locked(fcntl.LOCK_EX | fcntl.LOCK_NB)

    # --- blobs ----------------------------------------------------------------------------

    def blob_path(self, digest: str) -> Path:
        return self.root / blob_relpath(digest)

    def has_blob(self, digest: str) -> bool:
        return self.blob_path(digest).is_file()

    def new_tmp(self, what: str) -> tuple[int, Path]:
        """A new, uniquely named file in tmp/ (two adds of one file never share one)."""
        self.ensure()
        fd, name = tempfile.mkstemp(dir=self.tmp, prefix=f"{what}.", suffix=".partial")
        return fd, Path(name)

    def commit_blob(self, tmp: Path, digest: str) -> bool:
        """Move a verified file from tmp/ to its blob path; False (and the file dropped) when
        the mirror already holds that blob: the same bytes are stored once."""
        final = self.blob_path(digest)
        if final.is_file():
            tmp.unlink(missing_ok=True)
            return False
        os.chmod(tmp, 0o444)
        os.replace(tmp, final)
        sync_dir(final.parent)
        return True

    # --- manifests and refs ---------------------------------------------------------------

    def manifest_path(self, digest: str) -> Path:
        return self.manifests / f"{hex_of(digest)}.json"

    def write_manifest(self, manifest: ArtifactManifest) -> str:
        digest = manifest_digest(manifest)
        for f in manifest.files:
            if not self.has_blob(f.digest):
                raise MirrorError(f"manifest lists {f.path} ({f.digest}), which is not stored")
        body = manifest.model_dump_json(indent=2).encode() + b"\n"
        _write_json(self.manifest_path(digest), body)
        return digest

    def read_manifest(self, digest: str) -> ArtifactManifest:
        path = self.manifest_path(digest)
        try:
            return ArtifactManifest.model_validate_json(_read_small(path))
        except FileNotFoundError:
            raise MirrorError(f"manifest {digest} is not in the mirror") from None
        except ValidationError as err:
            raise MirrorError(f"manifest {path.name} is damaged: {err}") from None

    def ref_path(self, name: str) -> Path:
        return self.refs_dir / f"{check_ref_name(name)}.json"

    def set_ref(self, name: str, digest: str) -> None:
        body = json.dumps({"manifest": check_digest(digest)}).encode() + b"\n"
        _write_json(self.ref_path(name), body)

    def get_ref(self, name: str) -> str | None:
        try:
            doc = json.loads(_read_small(self.ref_path(name)))
        except FileNotFoundError:
            return None
        except ValueError as err:
            raise MirrorError(f"ref {name} is damaged: {err}") from None
        try:
            return check_digest(doc["manifest"] if isinstance(doc, dict) else "")
        except (KeyError, BadArtifact) as err:
            raise MirrorError(f"ref {name} is damaged: {err}") from None

    def refs(self) -> dict[str, str]:
        """Every ref and the manifest it names, by name."""
        if not self.refs_dir.is_dir():
            return {}
        out = {}
        for path in sorted(self.refs_dir.glob("*.json")):
            digest = self.get_ref(path.stem)
            if digest is not None:
                out[path.stem] = digest
        return out

    def remove_ref(self, name: str) -> bool:
        try:
            self.ref_path(name).unlink()
        except FileNotFoundError:
            return False
        return True


def _read_small(path: Path) -> bytes:
    with path.open("rb") as f:
        data = f.read(MAX_JSON_BYTES + 1)
    if len(data) > MAX_JSON_BYTES:
        raise MirrorError(f"{path.name} is larger than {MAX_JSON_BYTES} bytes: not the mirror's")
    return data


def _write_json(final: Path, body: bytes) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(name, 0o644)
        os.replace(name, final)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    sync_dir(final.parent)
