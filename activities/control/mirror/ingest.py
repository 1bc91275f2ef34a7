"""Copying a readable stream into the mirror: hashed while it is written to a file of its own
in tmp/, committed as a blob only when the copy is whole (and matches, when its digest was
known). Local files and Ollama's blobs come in this way; downloads (http_download.py) resume,
so they keep a partial of their own."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

from activities.control.mirror import files
from activities.control.mirror.errors import MirrorError
from activities.control.mirror.store import MirrorStore

CHUNK = 1 << 20
# (bytes done, bytes in all or None when unknown)
Progress = Callable[[int, int | None], None]


@dataclass(frozen=True)
class Stored:
    digest: str
    size: int
    new: bool  # False: the mirror already held these bytes


def ingest_stream(
    store: MirrorStore,
    src: BinaryIO,
    what: str,
    total: int | None = None,
    expected: str | None = None,
    progress: Progress | None = None,
) -> Stored:
    """`src` read to its end into a blob. On any failure the copy is removed: unlike a
    download, a local copy is quicker to redo than to resume."""
    fd, tmp = store.new_tmp("copy")
    digest = hashlib.sha256()
    done = 0
    try:
        with os.fdopen(fd, "wb") as out:
            while chunk := src.read(CHUNK):
                files.write_all(out, chunk)
                digest.update(chunk)
                done += len(chunk)
                if progress:
                    progress(done, total)
            out.flush()
            os.fsync(out.fileno())
        got = "sha256:" + digest.hexdigest()
        if expected is not None and got != expected:
            raise MirrorError(f"{what}: expected {expected}, its content hashes to {got}")
        return Stored(got, done, store.commit_blob(tmp, got))
    except OSError as err:
        full = files.disk_full_error(err, store.root, what)
        if full is not None:
            raise full from None
        raise
    finally:
        tmp.unlink(missing_ok=True)
