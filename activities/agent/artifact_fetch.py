"""A node's fetch of one artifact from the control plane's mirror (activities/control/
mirror_server.py) into its store (artifact_store.py). Blocking: the activity runs it in a thread
and heartbeats the progress it records.

Each blob is downloaded into `.partial/<hex>` and resumed with `Range: bytes=<size>-` after any
interruption (a killed agent, a dropped connection): the bytes already there are hashed again
first, so the digest that is checked covers the whole file, not only the part this call saw.
A blob is renamed into place only when its sha256 matches the manifest; a mismatch deletes the
partial (it cannot be told which bytes were wrong) and fails naming both digests.
"""

from __future__ import annotations

import hashlib
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from activities.agent.artifact_store import ArtifactStore, FetchStopped, check_layout, seal_blob
from workflows.artifact_names import SHA256, check_digest, manifest_digest
from workflows.contracts import ArtifactFile, ArtifactManifest, FetchProgressReport
from workflows.engine_keys import mirror_token
from workflows.mirror_protocol import BLOBS_PATH, MANIFESTS_PATH, NODE_HEADER

CHUNK = 1 << 20
# Manifests are small; one far larger is not a manifest.
MAX_MANIFEST_BYTES = 16 << 20
# Attempts per blob within one call when the connection drops; each resumes where the last
# stopped. Past them the activity fails and Temporal's retry resumes again.
TRANSPORT_ATTEMPTS = 3
_RETRY_PAUSE_S = 1.0
# No byte for this long is a dead connection (the transfer itself may take hours).
_TIMEOUT = httpx.Timeout(30.0, read=60.0)
GB = 1e9


class FetchFailed(Exception):
    """A fetch that retrying as it is cannot fix; `kind` is the activity's error type."""

    kind = "MirrorFailed"  # the mirror answered what no mirror should (a wrong range)


class MirrorRefused(FetchFailed):
    kind = "MirrorRefused"  # 401 (this node's token) or 404 (not in the mirror)


class BadManifest(FetchFailed):
    kind = "BadArtifact"  # not a manifest, another manifest's digest, or unsafe paths


class NoSpace(FetchFailed):
    kind = "NoSpace"


class DigestMismatch(Exception):
    """A blob's bytes did not hash to its digest; its partial is gone, so a retry starts over."""


@dataclass
class FetchProgress:
    """What the activity heartbeats; written by the fetching thread, read by the loop's."""

    total: int = 0
    done: int = 0
    fetched: int = 0
    current: str = ""
    note: str = "reading the manifest"

    def describe(self) -> str:
        if not self.total:
            return self.note
        share = 100 * self.done / self.total
        where = f" ({self.current})" if self.current else ""
        amount = f"{self.done / GB:.2f} of {self.total / GB:.2f} GB ({share:.0f}%)"
        return f"{self.note}{where}: {amount}"

    def report(self) -> FetchProgressReport:
        """The same, as numbers, for `llmgw fetches`."""
        return FetchProgressReport(
            done=self.done,
            total=self.total,
            fetched=self.fetched,
            current=self.current,
            note=self.note,
        )


@dataclass
class FetchOutcome:
    path: Path
    bytes_fetched: int
    reused: bool


@dataclass
class Mirror:
    """Where the mirror is and who is asking: the token is derived from the node's secret."""

    base_url: str
    node: str
    node_secret: bytes = field(repr=False)

    def client(self) -> httpx.Client:
        headers = {
            "Authorization": f"Bearer {mirror_token(self.node_secret)}",
            NODE_HEADER: self.node,
            # Bytes as stored: a resumed Range must count the blob's own bytes.
            "Accept-Encoding": "identity",
        }
        return httpx.Client(base_url=self.base_url.rstrip("/"), headers=headers, timeout=_TIMEOUT)


def fetch_artifact(
    store: ArtifactStore,
    mirror: Mirror,
    digest: str,
    progress: FetchProgress | None = None,
    stop: threading.Event | None = None,
) -> FetchOutcome:
    check_digest(digest)
    progress = progress or FetchProgress()
    stop = stop or threading.Event()
    if store.is_complete(digest):
        return FetchOutcome(store.artifact_dir(digest), 0, reused=True)
    store.prepare()
    with mirror.client() as client:
        manifest = _manifest(client, digest)
        with store.lock(digest, stop):
            # Another fetch of the same artifact may have finished while this one waited.
            if store.is_complete(digest):
                return FetchOutcome(store.artifact_dir(digest), 0, reused=True)
            wanted = _unique_blobs(manifest)
            progress.total = sum(f.size for f in wanted)
            _check_space(store, wanted)
            for file in wanted:
                with store.lock(file.digest, stop):
                    _fetch_blob(client, store, file, progress, stop)
            progress.note, progress.current = "laying out the artifact", ""
            path = store.assemble(digest, manifest)
    return FetchOutcome(path, progress.fetched, reused=False)


def _manifest(client: httpx.Client, digest: str) -> ArtifactManifest:
    response = client.get(f"{MANIFESTS_PATH}/{digest}")
    _refused(response, f"manifest {digest}")
    if len(response.content) > MAX_MANIFEST_BYTES:
        raise BadManifest(f"the mirror's manifest {digest} is {len(response.content)} bytes")
    try:
        manifest = ArtifactManifest.model_validate_json(response.content)
        check_layout(manifest)
    except ValueError as e:  # pydantic's ValidationError and BadArtifact are ValueErrors
        raise BadManifest(f"the mirror's manifest {digest} is not a valid manifest: {e}") from e
    actual = manifest_digest(manifest)
    if actual != digest:
        raise BadManifest(f"the mirror's manifest for {digest} has digest {actual}: refused")
    return manifest


def _refused(response: httpx.Response, what: str) -> None:
    if response.status_code == 401:
        raise MirrorRefused(f"the mirror refused this node's token for {what} (401)")
    if response.status_code == 404:
        raise MirrorRefused(f"the mirror has no {what} (404)")
    if response.status_code >= 400:
        # 5xx included: the activity's retry policy decides whether to ask again.
        raise httpx.HTTPStatusError(
            f"the mirror answered {response.status_code} for {what}",
            request=response.request,
            response=response,
        )


def _unique_blobs(manifest: ArtifactManifest) -> list[ArtifactFile]:
    # Two paths with the same bytes are one blob, fetched once.
    seen: dict[str, ArtifactFile] = {}
    for file in manifest.files:
        seen.setdefault(file.digest, file)
    return list(seen.values())


def _check_space(store: ArtifactStore, files: list[ArtifactFile]) -> None:
    remaining = 0
    for file in files:
        if store.blob(file.digest).is_file():
            continue
        partial = store.partial(file.digest)
        have = partial.stat().st_size if partial.is_file() else 0
        remaining += max(file.size - have, 0)
    free = shutil.disk_usage(store.root).free
    if remaining > free:
        raise NoSpace(f"fetching needs {amount(remaining)}, {amount(free)} free on {store.root}")


def amount(n: int) -> str:
    """GB for weights; bytes where GB would print as 0.00."""
    return f"{n / GB:.2f} GB" if n >= GB / 100 else f"{n:,} bytes"


def _fetch_blob(
    client: httpx.Client,
    store: ArtifactStore,
    file: ArtifactFile,
    progress: FetchProgress,
    stop: threading.Event,
) -> None:
    blob = store.blob(file.digest)
    progress.current = file.path
    if blob.is_file():
        progress.done += file.size
        return
    partial = store.partial(file.digest)
    if partial.is_file() and partial.stat().st_size > file.size:
        partial.unlink()  # longer than the blob: not a prefix of it
    partial.touch()  # an empty file asks for nothing, yet its blob is this file
    start_done = progress.done
    for attempt in range(1, TRANSPORT_ATTEMPTS + 1):
        progress.done = start_done
        hasher = _hash_existing(partial, progress, stop)
        try:
            hasher = _download(client, partial, file, hasher, progress, stop)
            break
        except httpx.TransportError:
            if attempt == TRANSPORT_ATTEMPTS or stop.wait(_RETRY_PAUSE_S):
                raise
    actual = SHA256 + hasher.hexdigest()
    if actual != file.digest:
        partial.unlink(missing_ok=True)
        raise DigestMismatch(
            f"{file.path}: expected {file.digest}, got {actual}; the download was removed"
        )
    seal_blob(partial, blob)


def _hash_existing(partial: Path, progress: FetchProgress, stop: threading.Event) -> hashlib._Hash:
    hasher = hashlib.sha256()
    if not partial.is_file():
        return hasher
    progress.note = "checking what was already downloaded"
    with partial.open("rb") as f:
        while chunk := f.read(CHUNK):
            if stop.is_set():
                raise FetchStopped("stopped while re-reading a partial download")
            hasher.update(chunk)
            progress.done += len(chunk)
    return hasher


def _download(
    client: httpx.Client,
    partial: Path,
    file: ArtifactFile,
    hasher: hashlib._Hash,
    progress: FetchProgress,
    stop: threading.Event,
) -> hashlib._Hash:
    """Append the rest of the blob to its partial; the hasher, which covers the whole file."""
    have = partial.stat().st_size if partial.is_file() else 0
    if have == file.size:
        return hasher
    progress.note = "fetching"
    headers = {"Range": f"bytes={have}-"} if have else {}
    with client.stream("GET", f"{BLOBS_PATH}/{file.digest}", headers=headers) as response:
        _refused(response, f"blob {file.digest}")
        mode = "ab"
        if have and response.status_code == 200:
            # The whole blob came back, not the range: start the partial over.
            mode, have = "wb", 0
            progress.done -= partial.stat().st_size
            hasher = hashlib.sha256()
        elif have and not response.headers.get("Content-Range", "").startswith(f"bytes {have}-"):
            raise FetchFailed(f"the mirror answered the wrong range for {file.path}")
        with partial.open(mode) as out:
            for chunk in _chunks(response, stop):
                have += len(chunk)
                if have > file.size:
                    raise FetchFailed(f"the mirror sent more than {file.size} bytes of {file.path}")
                out.write(chunk)
                hasher.update(chunk)
                progress.done += len(chunk)
                progress.fetched += len(chunk)
    return hasher


def _chunks(response: httpx.Response, stop: threading.Event) -> Iterator[bytes]:
    # As the network delivers them: a chunk size would make httpx hold back what arrived before
    # a dropped connection, and the resume would ask for those bytes again.
    for chunk in response.iter_raw():
        if stop.is_set():
            raise FetchStopped("stopped while downloading")
        yield chunk


__all__ = [
    "BadManifest",
    "DigestMismatch",
    "FetchFailed",
    "FetchOutcome",
    "FetchProgress",
    "FetchStopped",
    "Mirror",
    "MirrorRefused",
    "NoSpace",
    "fetch_artifact",
]
