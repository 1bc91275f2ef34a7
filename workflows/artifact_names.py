"""Pure rules for artifact digests and paths, shared by the control plane's mirror and the
node agents' fetch (workflows/contracts/artifacts.py): what a digest looks like, where a blob
lives under a store's root, and what a manifest is named. No I/O."""

from __future__ import annotations

import hashlib
import json
import re

from workflows.contracts.artifacts import ArtifactManifest

SHA256 = "sha256:"
# Written last into an artifact's directory on a node: the files before it are all verified.
COMPLETE_MARKER = ".complete"
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_PART = re.compile(r"^[A-Za-z0-9._+-]{1,255}$")


class BadArtifact(ValueError):
    """A digest or path that is not one: the message says which and why."""


def check_digest(digest: str) -> str:
    """The digest unchanged when it is "sha256:" and 64 lowercase hex digits."""
    if not _DIGEST.match(digest):
        raise BadArtifact(f"not a sha256 digest: {digest[:80]!r} (want sha256:<64 hex digits>)")
    return digest


def hex_of(digest: str) -> str:
    return check_digest(digest)[len(SHA256) :]


def blob_relpath(digest: str) -> str:
    """Where a blob lives under a store's root: "blobs/sha256/<hex>"."""
    return f"blobs/sha256/{hex_of(digest)}"


def check_relative_path(path: str) -> str:
    """A file's path inside an artifact: relative, "/"-separated, no "." or ".." parts, no
    empty parts, each part of letters, digits and ._+- only (so no part can escape the
    artifact's directory, whatever the file system)."""
    parts = path.split("/")
    for part in parts:
        if part in ("", ".", "..") or not _PART.match(part):
            raise BadArtifact(f"not a safe relative path inside an artifact: {path[:200]!r}")
    return path


def artifact_hint(digest: str) -> str:
    """An artifact named in a node's inventory: "sha256:" and its first 16 hex digits. Enough
    for placement's preference (a collision would only misplace a preference), and a third of
    the full digest's size in the ledger's record of every node. Never raises: the ledger
    workflow calls it while placing."""
    return digest[: len(SHA256) + 16]


def manifest_digest(manifest: ArtifactManifest) -> str:
    """The artifact's name: sha256 of its files (path, digest, size), sorted by path, as
    canonical JSON. The source is left out: the same files are the same artifact."""
    files = sorted((f.path, f.digest, f.size) for f in manifest.files)
    blob = json.dumps(files, separators=(",", ":")).encode()
    return SHA256 + hashlib.sha256(blob).hexdigest()
