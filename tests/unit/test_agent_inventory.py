"""`llmgw agent inventory` on this machine: what the scheduler would see of it, with nothing
joined or started."""

import json
import os
from pathlib import Path

import pytest

from engines.engine_dir import write_marker
from workers import cli
from workflows.contracts import NodeRecord


def inventory(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    cli.main(["agent", "inventory", "--node", "node-a", *args])
    return capsys.readouterr().out


def installed_llama_server(state_dir: Path) -> Path:
    directory = state_dir / "engines" / "llamacpp" / "11434.0.0"
    directory.mkdir(parents=True)
    (directory / "llama-server").write_text("#!/bin/sh\n")
    write_marker(directory, "llamacpp", "11434.0.0", "llama-server", "version: 11434")
    # An install that never finished is not an engine.
    (state_dir / "engines" / "llamacpp" / "11500.0.0").mkdir()
    return directory / "llama-server"


def test_a_machine_with_an_engine_is_placeable_as_described(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = installed_llama_server(tmp_path)
    out = inventory(capsys, "--state-dir", str(tmp_path), "--label", "pool=batch")
    assert out.startswith("node node-a, as the scheduler would see it:")
    assert f"cpu       {len(os.sched_getaffinity(0))} cores" in out
    assert "labels    pool=batch" in out
    assert f"engine    llamacpp 11434.0.0 at {binary}" in out
    assert "11500.0.0" not in out
    assert "placeable: yes" in out


def test_a_machine_without_engines_says_why_nothing_would_be_placed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = inventory(capsys, "--state-dir", str(tmp_path))
    assert "engine    none installed in this state dir" in out
    assert "not placeable: no engine yet" in out
    # An operator's binary counts, as it does for the agent.
    out = inventory(
        capsys, "--state-dir", str(tmp_path), "--engine-path", "llamacpp=/opt/llama-server"
    )
    assert "engine    llamacpp operator-provided at /opt/llama-server" in out
    assert "placeable: yes" in out


def test_json_is_the_record_placement_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    installed_llama_server(tmp_path)
    record = NodeRecord.model_validate(
        json.loads(inventory(capsys, "--state-dir", str(tmp_path), "--json"))
    )
    assert record.inventory.name == "node-a"
    assert record.inventory.memory_mb > 0
    assert record.inventory.artifact_disk_free_mb is not None
    assert list(record.engines) == ["llamacpp"]
