"""A node's fetch of an artifact from a real mirror server on loopback: what lands in the node's
store, resuming a partial download, digests that do not match, manifests that are refused, a
second fetch, a full disk, and two fetches at once."""

import asyncio
import hashlib
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.typedefs import Handler
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.agent import artifact_fetch
from activities.agent.artifact_activity import ArtifactActivities
from activities.agent.artifact_fetch import (
    DigestMismatch,
    FetchFailed,
    FetchOutcome,
    Mirror,
    fetch_artifact,
)
from activities.agent.artifact_store import MARKER, ArtifactStore
from activities.agent.config import AgentConfig
from tests.unit.mirror_kit import (
    NODE,
    NODE_SECRET,
    RunningMirror,
    put_artifact,
    put_manifest,
    running_mirror,
)
from workflows.artifact_names import manifest_digest
from workflows.contracts import (
    ArtifactFile,
    ArtifactManifest,
    FetchArtifactRequest,
    FetchProgressReport,
)

WEIGHTS = hashlib.sha256(b"w").digest() * 4096  # 128 KiB
TOKENIZER = b'{"vocab": ["a", "b"]}'
FILES = {"model.gguf": WEIGHTS, "tokenizer/config.json": TOKENIZER, "copy/config.json": TOKENIZER}


@pytest.fixture
async def mirror(tmp_path: Path) -> AsyncIterator[RunningMirror]:
    async for running in running_mirror(tmp_path / "mirror"):
        yield running


def node_config(tmp_path: Path, mirror: str = "") -> AgentConfig:
    return AgentConfig(
        NODE, "127.0.0.1", tmp_path / "node", tmp_path / "cache", NODE_SECRET, mirror=mirror
    )


@pytest.fixture
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(node_config(tmp_path).artifacts_root)


async def fetch(store: ArtifactStore, mirror: RunningMirror, digest: str) -> FetchOutcome:
    node = Mirror(mirror.url, NODE, NODE_SECRET)
    return await asyncio.to_thread(fetch_artifact, store, node, digest)


def weights_file(manifest: ArtifactManifest) -> ArtifactFile:
    return next(f for f in manifest.files if f.path == "model.gguf")


async def test_the_activity_lays_out_every_file_with_its_marker(
    mirror: RunningMirror, tmp_path: Path
) -> None:
    digest, _ = put_artifact(tmp_path / "mirror", FILES)
    # The request names no mirror: the one the agent was started with is used.
    config = node_config(tmp_path, mirror=mirror.url)
    env = ActivityEnvironment()
    beats: list[Any] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    request = FetchArtifactRequest(manifest=digest)
    result = await env.run(ArtifactActivities(config).fetch_artifact, request)

    artifact = Path(result.path)
    assert artifact == tmp_path / "node" / "artifacts" / digest.removeprefix("sha256:")
    assert {p: (artifact / p).read_bytes() for p in FILES} == FILES
    assert (artifact / MARKER).is_file()
    assert not result.reused
    # The tokenizer's bytes under two paths are one blob, fetched once.
    assert result.bytes_fetched == len(WEIGHTS) + len(TOKENIZER)
    assert len(mirror.seen.blob_requests()) == 2
    # Hard links to read-only blobs: an engine cannot write through them into the store.
    weights = artifact / "model.gguf"
    assert weights.stat().st_nlink == 2
    assert not os.access(weights, os.W_OK) or os.geteuid() == 0
    assert beats, "the activity heartbeats its progress"
    # A line for the Temporal UI, then the numbers `llmgw fetches` reads.
    line, report = beats[0]
    assert isinstance(line, str)
    assert isinstance(report, FetchProgressReport)
    # The first, the one Temporal gets at once, already knows how much there is to fetch.
    assert report.total == len(WEIGHTS) + len(TOKENIZER)
    assert not list((tmp_path / "node" / "artifacts").glob(".tmp-*"))


async def test_a_partial_blob_is_resumed_from_its_size_and_still_checks(
    mirror: RunningMirror, store: ArtifactStore, tmp_path: Path
) -> None:
    digest, manifest = put_artifact(tmp_path / "mirror", FILES)
    weights = weights_file(manifest)
    store.prepare()
    store.partial(weights.digest).write_bytes(WEIGHTS[:50_000])

    outcome = await fetch(store, mirror, digest)

    assert ("GET", f"/mirror/v1/blobs/{weights.digest}", "bytes=50000-") in mirror.seen.requests
    assert outcome.bytes_fetched == len(WEIGHTS) - 50_000 + len(TOKENIZER)
    assert (outcome.path / "model.gguf").read_bytes() == WEIGHTS
    assert not store.partial(weights.digest).exists()


async def test_a_corrupt_partial_fails_the_digest_is_removed_and_a_retry_succeeds(
    mirror: RunningMirror, store: ArtifactStore, tmp_path: Path
) -> None:
    digest, manifest = put_artifact(tmp_path / "mirror", FILES)
    weights = weights_file(manifest)
    store.prepare()
    store.partial(weights.digest).write_bytes(b"\0" * 50_000)  # the right length, wrong bytes
    wrong = "sha256:" + hashlib.sha256(b"\0" * 50_000 + WEIGHTS[50_000:]).hexdigest()

    with pytest.raises(DigestMismatch) as failed:
        await fetch(store, mirror, digest)

    assert f"expected {weights.digest}, got {wrong}" in str(failed.value)
    assert "model.gguf" in str(failed.value)
    assert not store.partial(weights.digest).exists()
    assert not store.blob(weights.digest).exists()
    assert not store.is_complete(digest)

    before = len(mirror.seen.blob_requests())
    outcome = await fetch(store, mirror, digest)
    assert (outcome.path / "model.gguf").read_bytes() == WEIGHTS
    # The retry started over: no Range, the whole blob.
    assert mirror.seen.blob_requests()[before][2] == ""


async def test_a_digest_mismatch_is_a_retryable_activity_failure(
    mirror: RunningMirror, tmp_path: Path
) -> None:
    digest, manifest = put_artifact(tmp_path / "mirror", FILES)
    config = node_config(tmp_path)
    store = ArtifactStore(config.artifacts_root)
    store.prepare()
    store.partial(weights_file(manifest).digest).write_bytes(b"\0" * 10)
    request = FetchArtifactRequest(manifest=digest, mirror=mirror.url)
    with pytest.raises(ApplicationError) as failed:
        await ActivityEnvironment().run(ArtifactActivities(config).fetch_artifact, request)
    assert failed.value.type == "DigestMismatch"
    assert not failed.value.non_retryable


async def test_a_manifest_whose_digest_differs_is_refused(
    mirror: RunningMirror, store: ArtifactStore, tmp_path: Path
) -> None:
    asked, _ = put_artifact(tmp_path / "mirror", FILES)
    _, other = put_artifact(tmp_path / "mirror", {"model.gguf": b"other weights"})
    # The mirror's file for `asked` holds another manifest.
    hex_ = asked.removeprefix("sha256:")
    (tmp_path / "mirror" / "manifests" / "sha256" / f"{hex_}.json").write_text(
        other.model_dump_json()
    )
    with pytest.raises(
        FetchFailed, match=f"manifest for {asked} has digest {manifest_digest(other)}"
    ):
        await fetch(store, mirror, asked)
    assert mirror.seen.blob_requests() == []
    assert not store.artifact_dir(asked).exists()


@pytest.mark.parametrize("path", ["../escaped", "/etc/escaped", "a/../../escaped", MARKER])
async def test_a_manifest_with_an_unsafe_path_is_refused(
    mirror: RunningMirror, store: ArtifactStore, tmp_path: Path, path: str
) -> None:
    _, good = put_artifact(tmp_path / "mirror", {"model.gguf": b"weights"})
    bad = ArtifactManifest(files=[good.files[0].model_copy(update={"path": path})])
    digest = put_manifest(tmp_path / "mirror", bad)
    with pytest.raises(FetchFailed, match="not a valid manifest"):
        await fetch(store, mirror, digest)
    assert mirror.seen.blob_requests() == []
    assert not (tmp_path / "node" / "escaped").exists()
    assert not (tmp_path / "escaped").exists()


async def test_a_complete_artifact_is_reused_without_asking_the_mirror(
    mirror: RunningMirror, store: ArtifactStore, tmp_path: Path
) -> None:
    digest, _ = put_artifact(tmp_path / "mirror", FILES)
    first = await fetch(store, mirror, digest)
    asked = len(mirror.seen.requests)
    second = await fetch(store, mirror, digest)
    assert second.reused
    assert second.bytes_fetched == 0
    assert second.path == first.path
    assert len(mirror.seen.requests) == asked


async def test_too_little_disk_fails_before_downloading_and_says_how_much(
    mirror: RunningMirror, store: ArtifactStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    digest, _ = put_artifact(tmp_path / "mirror", FILES)
    needed = len(WEIGHTS) + len(TOKENIZER)
    # The store's file system with 1,000 bytes free (the fetch reads only `free`).
    monkeypatch.setattr(shutil, "disk_usage", lambda _: SimpleNamespace(free=1000))
    with pytest.raises(FetchFailed) as failed:
        await fetch(store, mirror, digest)
    assert str(failed.value) == (
        f"fetching needs {needed:,} bytes, 1,000 bytes free on {store.root}"
    )
    assert mirror.seen.blob_requests() == []


def test_amounts_print_in_gb_for_weights() -> None:
    assert artifact_fetch.amount(15_200_000_000) == "15.20 GB"
    assert artifact_fetch.amount(999) == "999 bytes"


async def test_two_fetches_of_one_artifact_at_once_download_each_blob_once(
    mirror: RunningMirror, store: ArtifactStore, tmp_path: Path
) -> None:
    digest, _ = put_artifact(tmp_path / "mirror", FILES)
    first, second = await asyncio.gather(fetch(store, mirror, digest), fetch(store, mirror, digest))
    assert first.path == second.path
    assert {p: (first.path / p).read_bytes() for p in FILES} == FILES
    assert sorted([first.reused, second.reused]) == [False, True]
    assert len(mirror.seen.blob_requests()) == 2


async def test_a_connection_dropped_mid_blob_is_resumed_within_the_call(
    store: ArtifactStore, tmp_path: Path
) -> None:
    digest, manifest = put_artifact(tmp_path / "mirror", {"model.gguf": WEIGHTS})
    blob = weights_file(manifest).digest
    sent = 40_000
    dropped: list[bool] = []

    @web.middleware
    async def drop_once(request: web.Request, handler: Handler) -> web.StreamResponse:
        if "/blobs/" not in request.path or dropped:
            return await handler(request)
        dropped.append(True)
        # The headers promise the whole blob; part of it comes, then the connection goes.
        response = web.StreamResponse(headers={"Content-Length": str(len(WEIGHTS))})
        await response.prepare(request)
        await response.write(WEIGHTS[:sent])
        assert request.transport is not None
        request.transport.close()
        return response

    async for mirror in running_mirror(tmp_path / "mirror", drop_once):
        outcome = await fetch(store, mirror, digest)
        assert ("GET", f"/mirror/v1/blobs/{blob}", f"bytes={sent}-") in mirror.seen.requests
    assert dropped
    assert (outcome.path / "model.gguf").read_bytes() == WEIGHTS


async def test_an_empty_file_and_a_killed_assembly_leave_nothing_behind(
    mirror: RunningMirror, store: ArtifactStore, tmp_path: Path
) -> None:
    digest, _ = put_artifact(tmp_path / "mirror", {"empty.txt": b"", "model.gguf": WEIGHTS})
    store.prepare()
    stale = store.root / f".tmp-{digest.removeprefix('sha256:')}-deadbeef"
    (stale / "half").mkdir(parents=True)

    outcome = await fetch(store, mirror, digest)

    assert (outcome.path / "empty.txt").read_bytes() == b""
    assert (outcome.path / "model.gguf").read_bytes() == WEIGHTS
    assert not stale.exists()
    assert list((store.root / ".partial").iterdir()) == []


@pytest.mark.parametrize(
    ("damage", "kind"),
    [
        pytest.param("manifest", "BadArtifact", id="another-manifest"),
        pytest.param("disk", "NoSpace", id="no-space"),
        pytest.param("token", "MirrorRefused", id="wrong-node"),
        pytest.param("no-mirror", "MirrorFailed", id="no-mirror"),
    ],
)
async def test_what_retrying_cannot_fix_fails_the_activity_for_good(
    mirror: RunningMirror,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    damage: str,
    kind: str,
) -> None:
    digest, _ = put_artifact(tmp_path / "mirror", FILES)
    config = node_config(tmp_path)
    request = FetchArtifactRequest(manifest=digest, mirror=mirror.url)
    if damage == "manifest":
        _, other = put_artifact(tmp_path / "mirror", {"x": b"y"})
        manifest_file = tmp_path / "mirror" / "manifests" / "sha256" / f"{digest[7:]}.json"
        manifest_file.write_text(other.model_dump_json())
    elif damage == "disk":
        monkeypatch.setattr(shutil, "disk_usage", lambda _: SimpleNamespace(free=0))
    elif damage == "token":
        config.node = "node-b"  # node-a's secret under node-b's name
    else:
        request = FetchArtifactRequest(manifest=digest)
    with pytest.raises(ApplicationError) as failed:
        await ActivityEnvironment().run(ArtifactActivities(config).fetch_artifact, request)
    assert failed.value.type == kind
    assert failed.value.non_retryable
    assert mirror.seen.blob_requests() == []
