"""Copying a blob out of an Ollama store, and verifying it: the bytes hashed a chunk at a time
as they are read (`hashed_chunks`), and a copy renamed into its content-addressed place only once
it matches its digest (`copy_verified`), so that a model's weights, gigabytes, are hashed once,
while they are copied, and never read whole into memory. The store itself, where a blob is and
whether it may be opened, is workers/ollama/store.py's.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from workers.ollama.store import CHUNK, Blob, OllamaStore, OllamaStoreError


def hashed_chunks(f: BinaryIO, blob: Blob) -> Iterator[bytes]:
    """The blob's bytes, a chunk at a time, hashed on the way. After the last chunk it is
    refused, naming the digest, when it is longer or shorter than the manifest says or hashes to
    anything else: what a caller took is verified only once the iteration ends."""
    digest = hashlib.sha256()
    remaining = blob.size
    while chunk := f.read(min(CHUNK, remaining + 1)):
        remaining -= len(chunk)
        if remaining < 0:
            raise OllamaStoreError(f"blob {blob} is longer than the {blob.size} bytes declared")
        digest.update(chunk)
        yield chunk
    if remaining:
        raise OllamaStoreError(f"blob {blob} is shorter than the {blob.size} bytes declared")
    got = digest.hexdigest()
    if got != blob.digest:
        raise OllamaStoreError(f"blob {blob} is corrupt: its content hashes to sha256:{got}")


def copy_verified(
    store: OllamaStore,
    blob: Blob,
    dest_dir: Path,
    suffix: str,
    progress: Callable[[int], None] | None = None,
) -> tuple[Path, bool]:
    """The blob at `<dest_dir>/sha256-<hex><suffix>`, content-addressed, and whether a file
    already there was reused. A file already there is used only if it hashes to the digest;
    otherwise the blob is copied into a temporary file in the same directory, hashed on the
    way, and renamed into place only when it matches, so the final path never holds a
    half-written or unverified file. `progress` is told the bytes copied so far, after each
    chunk (the web console shows an import's copy with it)."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    final = dest_dir / f"{blob.name}{suffix}"
    if _already_there(final, blob):
        return final, True
    src, _ = store.open_blob(blob)
    with os.fdopen(src, "rb") as f:
        tmp_fd, tmp_name = tempfile.mkstemp(dir=dest_dir, prefix=f".{blob.name}.", suffix=".part")
        try:
            with os.fdopen(tmp_fd, "wb") as out:
                copied = 0
                for chunk in hashed_chunks(f, blob):
                    out.write(chunk)
                    copied += len(chunk)
                    if progress is not None:
                        progress(copied)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp_name, 0o644)
            os.replace(tmp_name, final)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
    _sync_dir(dest_dir)
    return final, False


def _already_there(path: Path, blob: Blob) -> bool:
    """A regular file (not a link) of the blob's size and digest."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size != blob.size:
            return False
        try:
            for _ in hashed_chunks(f, blob):
                pass
        except OllamaStoreError:
            return False
    return True


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
