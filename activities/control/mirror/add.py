"""`mirror add`: a source's files into blobs, then their manifest, then the ref naming it, all
under the mirror's shared lock (store.py) so gc cannot take a blob between its arrival and the
manifest that lists it. The ref is written last: a failed add leaves no name pointing anywhere
new, only blobs (deduplicated, and gc's to remove when nothing lists them)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

import httpx

from activities.control.mirror import huggingface
from activities.control.mirror.errors import MirrorError
from activities.control.mirror.files import disk_full_error
from activities.control.mirror.http_download import TIMEOUT, Download, download
from activities.control.mirror.ingest import Progress, Stored, ingest_stream
from activities.control.mirror.local_files import local_files, open_regular
from activities.control.mirror.sources import (
    HfSource,
    LocalSource,
    Source,
    UrlSource,
)
from activities.control.mirror.store import MirrorStore, check_ref_name
from workflows.artifact_names import BadArtifact, check_relative_path
from workflows.contracts.artifacts import ArtifactFile, ArtifactManifest

# (what: the file being added, bytes done, bytes in all or None)
FileProgress = Callable[[str, int, int | None], None]


@dataclass(frozen=True)
class Added:
    name: str
    digest: str  # the manifest's
    manifest: ArtifactManifest
    new_bytes: int  # bytes of blobs the mirror did not hold before


def default_name(text: str) -> str:
    """A ref name made from a file or repository name: `SmolLM2-135M.Q8_0.gguf` ->
    `SmolLM2-135M.Q8_0`; characters a name does not take become `-`."""
    stem = text[: -len(".gguf")] if text.lower().endswith(".gguf") else text
    name = re.sub(r"[^A-Za-z0-9._-]", "-", stem).lstrip("._-")[:63]
    if not name:
        raise MirrorError(f"no mirror name can be made from {text[:80]!r}: give --name NAME")
    return check_ref_name(name)


def record(store: MirrorStore, name: str, source: str, stored: dict[str, Stored]) -> Added:
    """The manifest of the stored files and the ref naming it (call under store.adding())."""
    manifest = ArtifactManifest(
        files=[
            ArtifactFile(path=p, digest=s.digest, size=s.size) for p, s in sorted(stored.items())
        ],
        source=source,
    )
    try:
        digest = store.write_manifest(manifest)
        store.set_ref(name, digest)
    except OSError as err:
        full = disk_full_error(err, store.root, f"the manifest of {name}")
        if full is None:
            raise
        raise full from None
    return Added(name, digest, manifest, sum(s.size for s in stored.values() if s.new))


def _each(progress: FileProgress | None, what: str) -> Progress | None:
    if progress is None:
        return None
    return lambda done, total: progress(what, done, total)


def add_local(
    store: MirrorStore, source: LocalSource, name: str | None, progress: FileProgress | None
) -> Added:
    found = local_files(source.path)
    given = Path(source.path).expanduser()
    # Named before any copy, so a name that cannot be made fails before gigabytes are read.
    name = name or default_name(given.resolve().name if given.is_dir() else given.name)
    stored = {}
    for item in found:
        src, size = open_regular(item.real)
        with src:
            stored[item.path] = ingest_stream(
                store, src, item.path, total=size, progress=_each(progress, item.path)
            )
    return record(store, name, str(given.absolute()), stored)


def add_url(
    store: MirrorStore,
    client: httpx.Client,
    source: UrlSource,
    name: str | None,
    progress: FileProgress | None,
) -> Added:
    base = unquote(PurePosixPath(urlsplit(source.url).path).name)
    try:
        path = check_relative_path(base)
    except BadArtifact:
        raise MirrorError(
            f"{source.public}: the URL's last part {base[:80]!r} is not a usable file name"
        ) from None
    name = name or default_name(path)
    job = Download(url=source.url, what=source.public, expected=source.sha256)
    stored = download(store, client, job, _each(progress, path))
    return record(store, name, source.public, {path: stored})


def add_hf(
    store: MirrorStore,
    client: httpx.Client,
    source: HfSource,
    token: str | None,
    name: str | None,
    progress: FileProgress | None,
) -> Added:
    name = name or default_name(source.repo.split("/")[1])
    if source.files:
        revision, paths = source.revision, list(source.files)
    else:
        revision, paths = huggingface.list_repository(client, source, token)
    stored = {}
    for path in paths:
        job = huggingface.file_download(source, revision, path, token)
        stored[path] = download(store, client, job, _each(progress, path))
    public = HfSource(source.endpoint, source.repo, revision, ()).public
    return record(store, name, public, stored)


def add_source(
    store: MirrorStore,
    source: Source,
    name: str | None = None,
    hf_token: str | None = None,
    progress: FileProgress | None = None,
    client: httpx.Client | None = None,
) -> Added:
    """Add a local, URL or Hugging Face source (Ollama's is workers/ollama/mirror_add.py: its
    reader lives above this package). `hf_token` is the token itself, read by the caller from
    the reference the operator gave."""
    if name is not None:
        check_ref_name(name)
    with store.adding():
        if isinstance(source, LocalSource):
            return add_local(store, source, name, progress)
        own = client is None
        http = client or httpx.Client(timeout=TIMEOUT, follow_redirects=True)
        try:
            if isinstance(source, UrlSource):
                return add_url(store, http, source, name, progress)
            if isinstance(source, HfSource):
                return add_hf(store, http, source, hf_token, name, progress)
        finally:
            if own:
                http.close()
    raise MirrorError(f"{source.public}: this kind of source is added by its own command")
