"""A mirror's store written the way the control plane's mirror lays it out, a running mirror
server that records what nodes asked of it, and the node identity tests fetch as."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from activities.control.mirror_server import MirrorServer, mirror_app, start_mirror_server
from workflows.artifact_names import SHA256, blob_relpath, manifest_digest
from workflows.contracts import ArtifactFile, ArtifactManifest
from workflows.engine_keys import mirror_token, node_secret

MASTER = b"master-secret-for-mirror-tests-0123"
NODE = "node-a"
NODE_SECRET = node_secret(MASTER, NODE)
TOKEN = mirror_token(NODE_SECRET)


def digest_of(data: bytes) -> str:
    return SHA256 + hashlib.sha256(data).hexdigest()


def put_blob(root: Path, data: bytes) -> str:
    digest = digest_of(data)
    path = root / blob_relpath(digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return digest


def put_manifest(root: Path, manifest: ArtifactManifest) -> str:
    digest = manifest_digest(manifest)
    path = root / "manifests" / "sha256" / f"{digest.removeprefix(SHA256)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(manifest.model_dump_json())
    return digest


def put_artifact(root: Path, files: dict[str, bytes]) -> tuple[str, ArtifactManifest]:
    """Blobs and a manifest for `files` (path -> bytes); the manifest's digest and itself."""
    entries = [
        ArtifactFile(path=path, digest=put_blob(root, data), size=len(data))
        for path, data in sorted(files.items())
    ]
    manifest = ArtifactManifest(files=entries, source="test")
    return put_manifest(root, manifest), manifest


@dataclass
class Seen:
    """Requests the mirror answered: (method, path, Range header or "")."""

    requests: list[tuple[str, str, str]] = field(default_factory=list)

    def blob_requests(self) -> list[tuple[str, str, str]]:
        return [r for r in self.requests if "/blobs/" in r[1]]


@dataclass
class RunningMirror:
    server: MirrorServer
    seen: Seen

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"


async def running_mirror(root: Path, *middlewares: Middleware) -> AsyncIterator[RunningMirror]:
    """The mirror server on loopback, recording every request it answers; `middlewares` run
    inside the recording one (a test's faults)."""
    seen = Seen()

    @web.middleware
    async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
        seen.requests.append((request.method, request.path, request.headers.get("Range", "")))
        return await handler(request)

    app = mirror_app(root, MASTER)
    app.middlewares.append(record)
    app.middlewares.extend(middlewares)
    server = await start_mirror_server(root, MASTER, "127.0.0.1", 0, app=app)
    try:
        yield RunningMirror(server, seen)
    finally:
        await server.stop()
