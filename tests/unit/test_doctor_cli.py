"""`llmgw doctor` end to end on this machine, a real process reading the real /proc and PATH."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from engines.engine_dir import write_marker

RUN = "import sys; from workers.doctor import main; sys.exit(main(sys.argv[1:]))"
ROOT = Path(__file__).resolve().parents[2]


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", RUN, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def install_fake_engine(state: Path) -> None:
    directory = state / "engines" / "llamacpp" / "11434.0.0"
    directory.mkdir(parents=True)
    binary = directory / "llama-server"
    binary.write_text("#!/bin/sh\necho 'version: 11434 (abc1234)' >&2\n")
    binary.chmod(0o755)
    write_marker(directory, "llamacpp", "11434.0.0", "llama-server", "version: 11434 (abc1234)")


def test_doctor_on_this_machine_exit_status_matches_its_findings(tmp_path: Path) -> None:
    install_fake_engine(tmp_path)
    done = doctor("--state-dir", str(tmp_path), "--node", "here", "--json")
    assert done.returncode in (0, 1), done.stderr
    document = json.loads(done.stdout)
    findings = document["findings"]
    failing = [f for f in findings if f["severity"] == "fail"]
    assert done.returncode == (1 if failing else 0), failing
    assert document["facts"]["inventory"]["name"] == "here"
    assert document["facts"]["inventory"]["cpu_cores"] > 0
    engines = [f for f in findings if f["check"] == "engine"]
    assert [f["severity"] for f in engines] == ["ok"]
    # The fake engine really ran: its version line is what it printed.
    assert engines[0]["message"].startswith("llamacpp 11434.0.0 runs: version: 11434 (abc1234)")
    assert "socket" in document["nccl_env"]
    if not document["facts"]["nvidia_smi"]["found"] and not document["facts"]["inventory"]["gpus"]:
        # This machine is a CPU node: said as information, never as a failure.
        cpu = [f for f in findings if f["check"] == "gpus"]
        assert cpu[0]["severity"] == "info"
        assert cpu[0]["message"].startswith("CPU node")
        assert not [f for f in failing if f["check"].startswith(("nvidia", "gpu", "fabric"))]


def test_doctor_text_on_this_machine_without_engines_fails(tmp_path: Path) -> None:
    done = doctor("--state-dir", str(tmp_path), "--node", "here", "--address", "127.0.0.1")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("node here (127.0.0.1): ")
    assert f"FAIL  engine: no engine is installed under {tmp_path}/engines" in done.stdout
    assert "fix: start the agent" in done.stdout
    assert "NCCL environment for a shard over socket:" in done.stdout
