"""Kill the agent mid-fetch (issue 14): the fetch activity runs in its own process against a
real mirror server behind a slow link, is SIGKILLed while its partial blob is half there, and a
new fetch resumes from the partial with a Range request, downloads only the rest, and the blob
still hashes to its digest.

No Temporal server is needed: the activity runs in an ActivityEnvironment in the child process
(tests/integration/fetch_child.py), which is what a restarted agent's retry runs.
"""

import asyncio
import contextlib
import hashlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from activities.agent.artifact_store import ArtifactStore
from tests.unit.mirror_kit import RunningMirror, put_artifact, running_mirror
from workflows.contracts import FetchArtifactResult

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SIZE = 24 << 20
# The slow link: this many bytes, then a pause. About 4 MB/s, so the whole blob would take
# ~6 s: there is time to see the partial grow and kill the fetch before it completes.
SLICE = 64 << 10
PAUSE_S = 0.016
KILL_AFTER = 3 << 20


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slow: bool) -> None:
    try:
        while data := await reader.read(SLICE):
            writer.write(data)
            await writer.drain()
            if slow:
                await asyncio.sleep(PAUSE_S)
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def slow_link(port: int) -> AsyncIterator[int]:
    """A TCP proxy to 127.0.0.1:port that sends the mirror's answers slowly; its port."""
    tasks: set[asyncio.Task[None]] = set()

    async def relay(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", port)
        both = (_pipe(client_r, server_w, slow=False), _pipe(server_r, client_w, slow=True))
        await asyncio.gather(*both)

    def accepted(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(relay(r, w))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    proxy = await asyncio.start_server(accepted, "127.0.0.1", 0)
    try:
        yield proxy.sockets[0].getsockname()[1]
    finally:
        proxy.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def start_fetch(state: Path, mirror_url: str, digest: str) -> asyncio.subprocess.Process:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.integration.fetch_child",
        str(state),
        mirror_url,
        digest,
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


@pytest.fixture
async def mirror(tmp_path: Path) -> AsyncIterator[RunningMirror]:
    async for running in running_mirror(tmp_path / "mirror"):
        yield running


async def test_a_fetch_killed_midway_resumes_and_the_digest_still_checks(
    mirror: RunningMirror, tmp_path: Path
) -> None:
    weights = os.urandom(SIZE)
    digest, manifest = put_artifact(tmp_path / "mirror", {"model.gguf": weights})
    blob = manifest.files[0].digest
    state = tmp_path / "node"
    store = ArtifactStore(state / "artifacts")
    partial = store.partial(blob)

    async with slow_link(mirror.server.port) as port:
        child = await start_fetch(state, f"http://127.0.0.1:{port}", digest)
        try:
            async with asyncio.timeout(15):
                while not (partial.is_file() and partial.stat().st_size >= KILL_AFTER):
                    assert child.returncode is None, "the fetch ended before it could be killed"
                    await asyncio.sleep(0.02)
        finally:
            child.send_signal(signal.SIGKILL)
            await child.communicate()
    assert child.returncode == -signal.SIGKILL

    kept = partial.stat().st_size
    assert KILL_AFTER <= kept < SIZE, "killed with part of the blob downloaded"
    assert not store.blob(blob).exists()
    assert not store.is_complete(digest)

    again = await start_fetch(state, mirror.url, digest)
    async with asyncio.timeout(30):
        out, err = await again.communicate()
    assert again.returncode == 0, err.decode()[-2000:]
    result = FetchArtifactResult.model_validate_json(out)

    assert ("GET", f"/mirror/v1/blobs/{blob}", f"bytes={kept}-") in mirror.seen.requests
    assert result.bytes_fetched == SIZE - kept
    assert not result.reused
    fetched = Path(result.path) / "model.gguf"
    assert "sha256:" + hashlib.sha256(fetched.read_bytes()).hexdigest() == blob
    assert not partial.exists()
