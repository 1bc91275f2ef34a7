"""The control plane's mirror over HTTP, for node agents' fetches (issue 14).

`GET MANIFESTS_PATH/<digest>` answers an artifact's manifest JSON, `GET BLOBS_PATH/<digest>`
one blob's bytes; HEAD works on both. Blobs honour `Range: bytes=N-` and `bytes=N-M` (206 with
Content-Range, 416 when unsatisfiable) and are streamed from disk: aiohttp's FileResponse uses
sendfile, so a blob of many GB is never held in memory. A node resumes an interrupted download
with a Range from what it already has (activities/agent/artifact_fetch.py).

Every request names its node (`X-Llmgw-Node`) and shows `Authorization: Bearer
<mirror_token(node_secret(master, node))>`: the mirror derives each node's token from the master
secret, so it keeps no list of them, and a node's token is worth nothing under another node's
name. Every failure gets the same 401, so a caller learns nothing about which part was wrong.

The store's layout is the mirror's (the control plane's mirror writes it; this only reads):
`<root>/blobs/sha256/<hex>` and `<root>/manifests/sha256/<hex>.json`. A digest is checked
against artifact_names.check_digest before any path is made from it, so no request reaches a
file outside those two directories.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from activities.http_site import start_site
from workflows.artifact_names import BadArtifact, blob_relpath, hex_of
from workflows.engine_keys import mirror_token, node_secret
from workflows.mirror_protocol import BLOBS_PATH, MANIFESTS_PATH, NODE_HEADER

# Longer names are refused before any MAC is computed: no node is named like that.
MAX_NODE_NAME = 253
_ROOT = web.AppKey("root", Path)
_MASTER = web.AppKey("master", bytes)


def manifest_relpath(digest: str) -> str:
    """Where a manifest lives under the mirror's root: "manifests/sha256/<hex>.json"."""
    return f"manifests/sha256/{hex_of(digest)}.json"


def mirror_app(root: Path, master_secret: bytes) -> web.Application:
    app = web.Application()
    app[_ROOT] = root
    app[_MASTER] = master_secret
    # add_get also answers HEAD with the same handler (aiohttp drops the body).
    app.router.add_get(MANIFESTS_PATH + "/{digest}", _manifest)
    app.router.add_get(BLOBS_PATH + "/{digest}", _blob)
    return app


@dataclass
class MirrorServer:
    runner: web.AppRunner
    port: int

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_mirror_server(
    root: Path, master_secret: bytes, host: str, port: int, app: web.Application | None = None
) -> MirrorServer:
    """Serve the mirror under `root` on host:port (0: any free port); the port it got is in the
    result. `app` is mirror_app(root, master_secret) unless given (tests add middlewares)."""
    runner, bound = await start_site(app or mirror_app(root, master_secret), host, port)
    return MirrorServer(runner, bound)


def _authorized(request: web.Request) -> bool:
    node = request.headers.get(NODE_HEADER, "")
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if not node or len(node) > MAX_NODE_NAME or scheme.lower() != "bearer":
        return False
    expected = mirror_token(node_secret(request.app[_MASTER], node))
    # Compared in constant time: the token is the mirror's only lock.
    return hmac.compare_digest(given.encode(), expected.encode())


def _unauthorized() -> web.Response:
    return web.json_response(
        {"error": f"a node's mirror token is required ({NODE_HEADER} and Authorization: Bearer)"},
        status=401,
        headers={"WWW-Authenticate": "Bearer"},
    )


def _file(request: web.Request, relpath: str) -> Path:
    path = request.app[_ROOT] / relpath
    if not path.is_file():
        raise web.HTTPNotFound(text=f"{request.match_info['digest']} is not in the mirror\n")
    return path


async def _manifest(request: web.Request) -> web.StreamResponse:
    if not _authorized(request):
        return _unauthorized()
    try:
        relpath = manifest_relpath(request.match_info["digest"])
    except BadArtifact as e:
        raise web.HTTPBadRequest(text=f"{e}\n") from None
    return web.FileResponse(_file(request, relpath), headers={"Content-Type": "application/json"})


async def _blob(request: web.Request) -> web.StreamResponse:
    if not _authorized(request):
        return _unauthorized()
    try:
        relpath = blob_relpath(request.match_info["digest"])
    except BadArtifact as e:
        raise web.HTTPBadRequest(text=f"{e}\n") from None
    # FileResponse answers Range itself: 206 with Content-Range, 416 past the end.
    return web.FileResponse(
        _file(request, relpath), headers={"Content-Type": "application/octet-stream"}
    )
