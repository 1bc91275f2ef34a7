"""The control plane's mirror server on loopback: who may read it, Range as a resuming node
uses it, and digests that are not digests."""

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from yarl import URL

from tests.unit.mirror_kit import MASTER, NODE, TOKEN, RunningMirror, put_artifact, running_mirror
from workflows.contracts import ArtifactManifest
from workflows.engine_keys import mirror_token, node_secret
from workflows.mirror_protocol import BLOBS_PATH, MANIFESTS_PATH, NODE_HEADER

DATA = bytes(range(256)) * 40  # 10,240 bytes
AUTH = {"Authorization": f"Bearer {TOKEN}", NODE_HEADER: NODE}


@pytest.fixture
async def mirror(tmp_path: Path) -> AsyncIterator[RunningMirror]:
    async for running in running_mirror(tmp_path / "mirror"):
        yield running


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
def artifact(tmp_path: Path) -> tuple[str, ArtifactManifest]:
    return put_artifact(tmp_path / "mirror", {"model.gguf": DATA})


async def test_a_node_with_its_token_reads_the_manifest_and_the_blob(
    mirror: RunningMirror, http: aiohttp.ClientSession, artifact: tuple[str, ArtifactManifest]
) -> None:
    digest, manifest = artifact
    async with http.get(f"{mirror.url}{MANIFESTS_PATH}/{digest}", headers=AUTH) as r:
        assert r.status == 200
        assert ArtifactManifest.model_validate_json(await r.read()) == manifest
    blob = manifest.files[0].digest
    async with http.get(f"{mirror.url}{BLOBS_PATH}/{blob}", headers=AUTH) as r:
        assert r.status == 200
        assert r.headers["Content-Length"] == str(len(DATA))
        assert await r.read() == DATA
    async with http.head(f"{mirror.url}{BLOBS_PATH}/{blob}", headers=AUTH) as r:
        assert r.status == 200
        assert r.headers["Content-Length"] == str(len(DATA))
        assert await r.read() == b""


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="no-headers"),
        pytest.param({"Authorization": f"Bearer {TOKEN}"}, id="no-node-header"),
        pytest.param({NODE_HEADER: NODE}, id="no-token"),
        pytest.param(
            {"Authorization": f"Bearer {mirror_token(node_secret(MASTER, 'node-b'))}"}
            | {NODE_HEADER: NODE},
            id="another-nodes-token",
        ),
        pytest.param({"Authorization": f"Bearer {TOKEN}", NODE_HEADER: "node-b"}, id="wrong-node"),
        pytest.param(
            {"Authorization": f"Bearer {mirror_token(node_secret(b'other', NODE))}"}
            | {NODE_HEADER: NODE},
            id="another-masters-token",
        ),
        pytest.param({"Authorization": f"Basic {TOKEN}", NODE_HEADER: NODE}, id="not-bearer"),
    ],
)
async def test_every_failure_gets_the_same_401(
    mirror: RunningMirror,
    http: aiohttp.ClientSession,
    artifact: tuple[str, ArtifactManifest],
    headers: dict[str, str],
) -> None:
    digest, manifest = artifact
    bodies = set()
    for path in (f"{MANIFESTS_PATH}/{digest}", f"{BLOBS_PATH}/{manifest.files[0].digest}"):
        async with http.get(mirror.url + path, headers=headers) as r:
            assert r.status == 401
            bodies.add(await r.text())
    async with http.get(f"{mirror.url}{BLOBS_PATH}/sha256:nonsense", headers=headers) as r:
        assert r.status == 401  # refused before the digest is even looked at
        bodies.add(await r.text())
    assert len(bodies) == 1
    assert "token" in bodies.pop()


async def test_ranges_answer_206_with_content_range_and_416_past_the_end(
    mirror: RunningMirror, http: aiohttp.ClientSession, artifact: tuple[str, ArtifactManifest]
) -> None:
    url = f"{mirror.url}{BLOBS_PATH}/{artifact[1].files[0].digest}"
    size = len(DATA)
    async with http.get(url, headers=AUTH | {"Range": "bytes=4000-"}) as r:
        assert r.status == 206
        assert r.headers["Content-Range"] == f"bytes 4000-{size - 1}/{size}"
        assert r.headers["Content-Length"] == str(size - 4000)
        assert await r.read() == DATA[4000:]
    async with http.get(url, headers=AUTH | {"Range": "bytes=10-19"}) as r:
        assert r.status == 206
        assert r.headers["Content-Range"] == f"bytes 10-19/{size}"
        assert await r.read() == DATA[10:20]
    async with http.get(url, headers=AUTH | {"Range": f"bytes={size}-"}) as r:
        assert r.status == 416
        assert r.headers["Content-Range"] == f"bytes */{size}"


@pytest.mark.parametrize(
    "raw",
    [
        "sha256%3A..%2F..%2Fsecret",
        "..%2F..%2Fsecret",
        "sha256:" + "A" * 64,  # upper case: not how digests are written
        "sha256:" + "0" * 63,
        "md5:d41d8cd98f00b204e9800998ecf8427e",
        "sha256:" + "0" * 64 + "%2F..%2F..%2Fsecret",
    ],
)
async def test_what_is_not_a_digest_never_reaches_the_file_system(
    mirror: RunningMirror, http: aiohttp.ClientSession, tmp_path: Path, raw: str
) -> None:
    (tmp_path / "secret").write_text("the master secret")
    for base in (BLOBS_PATH, MANIFESTS_PATH):
        url = URL(f"{mirror.url}{base}/{raw}", encoded=True)
        async with http.get(url, headers=AUTH) as r:
            assert r.status in (400, 404)
            assert "the master secret" not in await r.text()


async def test_a_digest_the_mirror_lacks_is_404(
    mirror: RunningMirror, http: aiohttp.ClientSession
) -> None:
    async with http.get(f"{mirror.url}{BLOBS_PATH}/sha256:{'0' * 64}", headers=AUTH) as r:
        assert r.status == 404
        assert "not in the mirror" in await r.text()
