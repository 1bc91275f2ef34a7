"""One file over HTTP(S) into the mirror: streamed to a partial in tmp/, hashed as it comes,
resumed with `Range: bytes=N-` when a partial is there, committed as a blob only when whole
and (when its digest was given) matching.

- The partial is named by a hash of the URL (credentials left out), so running the same
  `mirror add` again continues it, sending If-Range with the ETag (or Last-Modified) of the
  first response so a file changed since is sent whole; it is locked (flock) while written,
  so a second add of the same URL at the same time is refused instead of writing into it.
- 206 with a Content-Range starting where the partial ends: continue. 200: the server ignored
  the Range, start over. 416: the partial is no prefix of the file, start over.
- A body shorter than its Content-Length, a dropped connection or a timeout keep the partial
  (run the command again to resume); so does a full disk (free space, then resume; `mirror gc`
  removes partials older than a day). A digest mismatch or a body longer than announced
  removes it: those bytes are wrong, not unfinished.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit, urlunsplit

import httpx

from activities.control.mirror import files
from activities.control.mirror.errors import MirrorError
from activities.control.mirror.ingest import CHUNK, Progress, Stored
from activities.control.mirror.store import MirrorStore

# Connecting should be quick; between two chunks a slow mirror may pause a while.
TIMEOUT = httpx.Timeout(60.0, connect=15.0)
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


@dataclass(frozen=True)
class Download:
    url: str  # may hold credentials: never printed or recorded
    what: str  # how messages name it: the URL without credentials, or a file of a repository
    expected: str | None = None  # "sha256:<hex>"
    headers: dict[str, str] = field(default_factory=dict)  # e.g. Authorization: never printed


def parse_content_range(value: str) -> tuple[int, int, int | None]:
    """(first byte, last byte, total or None) of `bytes first-last/total`."""
    match = _CONTENT_RANGE.match(value.strip())
    if match is None:
        raise MirrorError(f"the server's Content-Range {value[:80]!r} is not bytes N-M/TOTAL")
    first, last = int(match.group(1)), int(match.group(2))
    total = None if match.group(3) == "*" else int(match.group(3))
    if last < first or (total is not None and last >= total):
        raise MirrorError(f"the server's Content-Range {value[:80]!r} is inconsistent")
    return first, last, total


def partial_path(store: MirrorStore, url: str) -> Path:
    parts = urlsplit(url.partition("#")[0])
    host = parts.netloc.rpartition("@")[2]
    key = urlunsplit((parts.scheme.lower(), host.lower(), parts.path, parts.query, ""))
    return store.tmp / f"get-{hashlib.sha256(key.encode()).hexdigest()[:32]}.partial"


def download(
    store: MirrorStore,
    client: httpx.Client,
    job: Download,
    progress: Progress | None = None,
) -> Stored:
    store.ensure()
    if job.expected is not None and store.has_blob(job.expected):
        # Already mirrored under the digest the operator gave: nothing to download.
        return Stored(job.expected, store.blob_path(job.expected).stat().st_size, new=False)
    path = partial_path(store, job.url)
    validator = path.with_name(path.name + ".validator")
    with _locked_partial(path, job.what) as f:
        try:
            # Twice at most: a server that ignores or refuses the Range gets one fresh start.
            for _ in range(2):
                done = _fetch(store, client, job, f, validator, progress)
                if done is not None:
                    break
            else:
                raise MirrorError(f"{job.what}: the server refused to send it from the start")
        except MirrorError:
            if os.fstat(f.fileno()).st_size == 0:
                # Nothing to resume (a refused connection, an HTTP error): leave no file.
                path.unlink(missing_ok=True)
                validator.unlink(missing_ok=True)
            raise
        got, size = done
        validator.unlink(missing_ok=True)
        if job.expected is not None and got != job.expected:
            path.unlink(missing_ok=True)
            raise MirrorError(f"{job.what}: expected {job.expected}, the download hashes to {got}")
        return Stored(got, size, store.commit_blob(path, got))


def read_validator(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if text and len(text) < 512 and text.isprintable() else None


def keep_validator(path: Path, resp: httpx.Response) -> None:
    """What a resume sends as If-Range, so a file changed on the server since the partial
    began is sent whole (200) instead of appended to old bytes: a strong ETag, else
    Last-Modified, else nothing (then a resume trusts the server's file to be unchanged)."""
    etag = resp.headers.get("etag", "")
    value = etag if etag and not etag.startswith("W/") else resp.headers.get("last-modified", "")
    if value and value.isprintable() and len(value) < 512:
        path.write_text(value, encoding="ascii")
    else:
        path.unlink(missing_ok=True)


def _fetch(
    store: MirrorStore,
    client: httpx.Client,
    job: Download,
    f: BinaryIO,
    validator: Path,
    progress: Progress | None,
) -> tuple[str, int] | None:
    """(digest, size) of the whole file in the partial; None: start over."""
    have = os.fstat(f.fileno()).st_size
    # Identity: Content-Length and Range count the bytes as stored, not as compressed.
    headers = {**job.headers, "Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
        if (known := read_validator(validator)) is not None:
            headers["If-Range"] = known
    total: int | None = None
    try:
        with client.stream("GET", job.url, headers=headers) as resp:
            if have and resp.status_code == 416:
                _restart(f)
                return None
            if resp.status_code >= 400:
                raise MirrorError(_http_error(job.what, resp))
            if resp.status_code == 200 and have:
                _restart(f)  # the server ignored the Range: it is sending the whole file
                have = 0
            elif resp.status_code == 206:
                first, _, total = parse_content_range(resp.headers.get("content-range", ""))
                if total is None and resp.headers.get("content-length", "").isdigit():
                    total = have + int(resp.headers["content-length"])
                if first != have:
                    raise MirrorError(
                        f"{job.what}: asked for bytes from {have}, the server sent from {first}"
                    )
            elif resp.status_code != 200:
                raise MirrorError(_http_error(job.what, resp))
            if resp.status_code == 200:
                keep_validator(validator, resp)
                length = resp.headers.get("content-length")
                total = int(length) if length and length.isdigit() else None
            digest = _hash_prefix(f, have)
            done = _stream_body(store, job, resp, f, digest, have, total, progress)
    except httpx.HTTPError as err:
        size = os.fstat(f.fileno()).st_size
        why = f"{type(err).__name__}: {err}"
        if not size:
            raise MirrorError(f"{job.what}: the download failed ({why})") from None
        raise MirrorError(
            f"{job.what}: the download failed after {size} bytes ({why}); the partial is "
            "kept: run the same command again to resume"
        ) from None
    return "sha256:" + digest.hexdigest(), done


def _stream_body(
    store: MirrorStore,
    job: Download,
    resp: httpx.Response,
    f: BinaryIO,
    digest: hashlib._Hash,
    have: int,
    total: int | None,
    progress: Progress | None,
) -> int:
    done = have
    try:
        try:
            # As the bytes arrive: a chunk size would hold back what came before a drop.
            for chunk in resp.iter_raw():
                files.write_all(f, chunk)
                digest.update(chunk)
                done += len(chunk)
                if total is not None and done > total:
                    break
                if progress:
                    progress(done, total)
        finally:
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        full = files.disk_full_error(err, store.root, job.what)
        if full is None:
            raise
        raise MirrorError(
            f"{full}; the {os.fstat(f.fileno()).st_size} bytes downloaded so far are kept in "
            "tmp/: free some space and run the same command to resume (`llmgw mirror gc "
            "--tmp-older-than 0` removes them)"
        ) from None
    except httpx.HTTPError as err:
        if total is None:
            raise
        raise _truncated(job, done, total, f"{type(err).__name__}: {err}") from None
    if total is not None and done > total:
        os.ftruncate(f.fileno(), 0)
        raise MirrorError(f"{job.what}: the server sent more than the {total} bytes it announced")
    if total is not None and done < total:
        raise _truncated(job, done, total, "the connection closed early")
    return done


def _truncated(job: Download, done: int, total: int, why: str) -> MirrorError:
    return MirrorError(
        f"{job.what}: truncated download, {done} of {total} bytes ({why}); the partial is "
        "kept: run the same command again to resume"
    )


def _http_error(what: str, resp: httpx.Response) -> str:
    hint = ""
    if resp.status_code in (401, 403):
        hint = " (does it need a token? --hf-token-env VAR or --hf-token-file FILE)"
    return f"{what}: HTTP {resp.status_code} {resp.reason_phrase}{hint}"


def _restart(f: BinaryIO) -> None:
    os.ftruncate(f.fileno(), 0)
    f.seek(0)


def _hash_prefix(f: BinaryIO, size: int) -> hashlib._Hash:
    """The hash of the partial's bytes so far, and the file positioned at its end."""
    digest = hashlib.sha256()
    f.seek(0)
    left = size
    while left and (chunk := f.read(min(CHUNK, left))):
        digest.update(chunk)
        left -= len(chunk)
    f.seek(size)
    return digest


@contextlib.contextmanager
def _locked_partial(path: Path, what: str) -> Iterator[BinaryIO]:
    """The partial, open and locked. The lock is taken on the file the path names after
    locking: a partial just renamed into a blob by another add is never written to."""
    for _ in range(10):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise MirrorError(f"another `llmgw mirror add` is downloading {what} now") from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            # Unbuffered: what the file holds is exactly what was written, so a write that
            # fails (a full disk) leaves nothing for a later close to flush or fail on, and the
            # partial's size is where a resume starts.
            with os.fdopen(fd, "r+b", buffering=0) as f:
                yield f
            return
        os.close(fd)
    raise MirrorError(f"{what}: its partial download keeps changing under this add")
