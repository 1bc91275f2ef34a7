"""What a user of the mirror can see: its names, manifests and blobs."""

from __future__ import annotations

import hashlib
from pathlib import Path

from activities.control.mirror.store import MirrorStore


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def visible(store: MirrorStore) -> tuple[list[str], list[str], list[str]]:
    """(ref names, manifest files, blob files): what a failed add must leave unchanged."""

    def names(path: Path, pattern: str) -> list[str]:
        return sorted(p.name for p in path.glob(pattern)) if path.is_dir() else []

    return names(store.refs_dir, "*.json"), names(store.manifests, "*"), names(store.blobs, "*")


def all_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())
