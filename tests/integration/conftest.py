"""Integration: the real Temporal dev server and real llmgw processes (`llmgw up`), with the
small stand-in engine in place of llama-server so that many scenarios, kills included, run fast."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.system import STANDIN_ENGINE, System


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    system = System(tmp_path_factory.mktemp("state"), demo=False, engine_path=STANDIN_ENGINE)
    system.start(timeout=120)
    yield system
    if system.process is not None and system.process.poll() is None:
        system.stop()


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("weights") / "standin.gguf"
    path.write_bytes(b"GGUF stand-in weights")
    return path
