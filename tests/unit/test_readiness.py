"""Readiness against the stand-in engine: /health first, then /v1/models with the key."""

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities.agent.readiness import wait_ready
from tests.ports import free_port

STANDIN = Path(__file__).resolve().parent.parent / "standin_engine.py"
KEY = "llmgw-engine-test-key"


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    return path


@pytest.fixture
def engines() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def start(
    engines: list[subprocess.Popen[bytes]],
    port: int,
    weights: Path,
    load_delay: float,
    key: str = KEY,
) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [
            sys.executable,
            str(STANDIN),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-m",
            str(weights),
            "--load-delay",
            str(load_delay),
        ],
        env={"LLAMA_API_KEY": key, "PATH": "/usr/bin:/bin"},
    )
    engines.append(proc)
    return proc


async def test_ready_after_loading_with_heartbeats(
    engines: list[subprocess.Popen[bytes]], weights: Path
) -> None:
    port = free_port()
    proc = start(engines, port, weights, load_delay=1.0)
    beats: list[float] = []
    t0 = time.monotonic()
    result = await wait_ready(
        port, KEY, 20.0, lambda: beats.append(1), lambda: proc.poll() is None, poll_s=0.1
    )
    assert result.ready, result.detail
    assert time.monotonic() - t0 >= 0.9  # not before the model "loaded"
    assert len(beats) >= 5  # one per poll while it loaded


async def test_wrong_key_is_never_ready_and_says_401(
    engines: list[subprocess.Popen[bytes]], weights: Path
) -> None:
    port = free_port()
    proc = start(engines, port, weights, load_delay=0.1)
    # Loaded first (with the right key), so that the short wait below is all spent on the key:
    # on a busy machine the stand-in alone can take longer than that to start.
    loaded = await wait_ready(port, KEY, 60.0, lambda: None, lambda: proc.poll() is None, 0.1)
    assert loaded.ready, loaded.detail
    result = await wait_ready(
        port, "some-other-key", 1.5, lambda: None, lambda: proc.poll() is None, poll_s=0.1
    )
    assert not result.ready
    # /health passed (it needs no key); the key check is what failed.
    assert "/v1/models" in result.detail
    assert "401" in result.detail


async def test_process_dying_while_loading_stops_the_wait(
    engines: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    port = free_port()
    # No weights file: the engine exits with an error, as llama-server does.
    proc = start(engines, port, tmp_path / "missing.gguf", load_delay=5.0)
    t0 = time.monotonic()
    result = await wait_ready(port, KEY, 30.0, lambda: None, lambda: proc.poll() is None, 0.1)
    assert not result.ready
    assert "exited while loading" in result.detail
    assert time.monotonic() - t0 < 10


async def test_nothing_listening_times_out_with_the_connection_error() -> None:
    result = await wait_ready(free_port(), KEY, 0.5, lambda: None, lambda: True, poll_s=0.1)
    assert not result.ready
    assert "/health" in result.detail
    assert "ConnectError" in result.detail
