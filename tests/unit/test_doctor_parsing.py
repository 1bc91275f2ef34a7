"""The doctor's parsers, on text recorded from real machines, and gather_facts on this one."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from activities.agent.doctor import gather
from activities.agent.doctor.facts import DoctorFacts
from activities.agent.doctor.parsing import (
    is_agent_command,
    parse_cmdline,
    parse_is_active,
    parse_memlock,
    parse_persistence_csv,
    parse_proc_modules,
)
from engines.engine_dir import write_marker

PROC_MODULES = """\
nvidia_peermem 16384 0 - Live 0x0000000000000000 (POE)
nvidia_uvm 1437696 4 - Live 0x0000000000000000 (POE)
nvidia_drm 77824 0 - Live 0x0000000000000000 (POE)
nvidia 56578048 137 nvidia_peermem,nvidia_uvm,nvidia_drm, Live 0x0000000000000000 (POE)
mlx5_ib 450560 0 - Live 0x0000000000000000 (OE)
ib_uverbs 163840 2 nvidia_peermem,mlx5_ib, Live 0x0000000000000000 (OE)
ib_core 434176 8 rdma_ucm,ib_ipoib,ib_umad,ib_uverbs,mlx5_ib,ib_cm, Live 0x0000000000000000 (OE)
"""

LIMITS_UNLIMITED = """\
Limit                     Soft Limit           Hard Limit           Units
Max cpu time              unlimited            unlimited            seconds
Max locked memory         unlimited            unlimited            bytes
Max address space         unlimited            unlimited            bytes
"""
LIMITS_8M = LIMITS_UNLIMITED.replace(
    "Max locked memory         unlimited            unlimited",
    "Max locked memory         8388608              unlimited",
)


def test_proc_modules_names_every_loaded_module() -> None:
    names = parse_proc_modules(PROC_MODULES)
    assert names[:2] == ["nvidia_peermem", "nvidia_uvm"]
    assert "ib_uverbs" in names
    assert len(names) == 7


def test_memlock_from_proc_limits() -> None:
    assert parse_memlock(LIMITS_UNLIMITED) == (None, None)
    assert parse_memlock(LIMITS_8M) == (8388608, None)
    assert parse_memlock("Max cpu time unlimited unlimited seconds\n") is None


def test_agent_is_recognised_by_its_command_line() -> None:
    venv = parse_cmdline(
        b"/opt/llmgw/.venv/bin/python3\0/opt/llmgw/.venv/bin/llmgw\0agent\0"
        b"--node\0gpu-01\0--address\x0010.0.0.5\0"
    )
    assert is_agent_command(venv, "gpu-01")
    assert not is_agent_command(venv, "gpu-02")  # another node's agent on a shared host
    assert is_agent_command(["llmgw", "agent", "--temporal", "x:7233"], "gpu-01")
    assert is_agent_command(["python", "-m", "workers.cli", "agent", "--node=gpu-01"], "gpu-01")
    assert not is_agent_command(["llmgw", "gateway"], "gpu-01")
    assert not is_agent_command(["llmgw", "doctor", "--node", "gpu-01"], "gpu-01")
    assert not is_agent_command(["/usr/bin/vim", "agent"], "gpu-01")


def test_systemctl_is_active_answer_is_the_word_on_stdout() -> None:
    assert parse_is_active("active\n") == "active"
    assert parse_is_active("inactive\n") == "inactive"
    assert parse_is_active("") == "unknown"  # no systemd: it only complains on stderr


def test_persistence_mode_per_card() -> None:
    text = "0, Enabled\n1, Disabled\n2, Enabled\n"
    assert parse_persistence_csv(text) == {0: True, 1: False, 2: True}
    assert parse_persistence_csv("No devices were found\n") == {}


def _fake_llama_server(directory: Path) -> Path:
    directory.mkdir(parents=True)
    binary = directory / "llama-server"
    # llama-server prints its version on stderr.
    binary.write_text("#!/bin/sh\necho 'version: 11434 (abc1234)' >&2\n")
    binary.chmod(0o755)
    return binary


def test_gather_reads_engines_and_their_markers(tmp_path: Path) -> None:
    good = tmp_path / "engines" / "llamacpp" / "11434.0.0"
    _fake_llama_server(good)
    write_marker(good, "llamacpp", "11434.0.0", "llama-server", "version: 11434 (abc1234)")
    (tmp_path / "engines" / "llamacpp" / "11500.0.0").mkdir()  # an install that never finished
    (tmp_path / "engines" / "llamacpp" / ".11500.0.0.lock").touch()

    facts = gather.gather_facts(tmp_path, "node-a", "127.0.0.1")
    assert isinstance(facts, DoctorFacts)
    by_version = {e.version: e for e in facts.engines}
    assert set(by_version) == {"11434.0.0", "11500.0.0"}
    assert by_version["11434.0.0"].runnable is True
    assert by_version["11434.0.0"].detail.startswith("version: 11434 (abc1234)")
    assert by_version["11500.0.0"].marker is False
    assert facts.inventory.name == "node-a"
    assert facts.state_dir == str(tmp_path)
    assert facts.memlock is not None
    assert facts.memlock.source.startswith("this shell")


def test_gather_verifies_an_operator_named_binary(tmp_path: Path) -> None:
    binary = _fake_llama_server(tmp_path / "custom")
    missing = tmp_path / "nowhere" / "llama-server"
    facts = gather.gather_facts(
        tmp_path / "state", "node-a", "127.0.0.1", {"llamacpp": str(binary)}
    )
    assert [(e.path, e.runnable) for e in facts.engines] == [(str(binary), True)]
    facts = gather.gather_facts(
        tmp_path / "state", "node-a", "127.0.0.1", {"llamacpp": str(missing)}
    )
    assert facts.engines[0].runnable is False
    assert "does not exist" in facts.engines[0].detail


def test_gather_survives_a_discovery_that_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(_name: str, _address: str) -> None:
        raise RuntimeError("nvidia-smi -q -x exited 9: NVIDIA-SMI has failed")

    monkeypatch.setattr(gather, "discover_inventory", broken)
    facts = gather.gather_facts(tmp_path, "node-a", "10.0.0.5")
    assert facts.inventory.address == "10.0.0.5"
    assert facts.inventory.problems == [
        "discovery failed: nvidia-smi -q -x exited 9: NVIDIA-SMI has failed"
    ]


def test_engine_pids_are_the_shards_process_groups(tmp_path: Path) -> None:
    shards = tmp_path / "agent" / "node-a" / "shards"
    shards.mkdir(parents=True)
    (shards / "m-0.json").write_text(f'{{"pid": {os.getpid()}}}')
    (shards / "broken.json").write_text("{")
    pids = gather._engine_pids(tmp_path, "node-a")
    assert os.getpid() in pids


def _fake_python_engine(state_dir: Path, engine: str, version: str, entry_script: str) -> None:
    """An installed Python engine as its install leaves it: a virtual environment and the
    marker naming its entry point (vLLM's `vllm` script; SGLang's python, with an empty
    `entry_script`)."""
    directory = state_dir / "engines" / engine / version
    bin_dir = directory / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    entry = bin_dir / "python"
    if entry_script:
        entry = bin_dir / engine
        entry.write_text(entry_script)
        entry.chmod(0o755)
    write_marker(directory, engine, version, str(entry.relative_to(directory)), "as installed")


def test_gather_verifies_every_engine_not_only_llama_cpp(tmp_path: Path) -> None:
    """vLLM and SGLang environments are checked as the agent's re-verification checks them:
    one whose entry point answers is runnable; one that cannot load its libraries is not, and
    says why; SGLang on a machine without an NVIDIA GPU (this one) is not, whatever its
    environment holds, saying that it needs one."""
    _fake_python_engine(tmp_path, "vllm", "0.9.2", "#!/bin/sh\necho 0.9.2\n")
    _fake_python_engine(tmp_path, "sglang", "0.4.9", "")
    facts = gather.gather_facts(tmp_path, "node-a", "127.0.0.1")
    by_engine = {e.engine: e for e in facts.engines}
    assert by_engine["vllm"].runnable is True
    assert by_engine["vllm"].detail == "vllm 0.9.2"
    assert by_engine["sglang"].runnable is False
    assert by_engine["sglang"].detail.startswith("SGLang needs an NVIDIA GPU")

    broken = (
        "#!/bin/sh\necho 'ImportError: libcudart.so.12: cannot open shared object' >&2\nexit 1\n"
    )
    (tmp_path / "engines" / "vllm" / "0.9.2" / "venv" / "bin" / "vllm").write_text(broken)
    facts = gather.gather_facts(tmp_path, "node-a", "127.0.0.1")
    vllm = next(e for e in facts.engines if e.engine == "vllm")
    assert vllm.runnable is False
    assert "libcudart.so.12" in vllm.detail


def test_gather_names_an_engine_this_llmgw_does_not_know(tmp_path: Path) -> None:
    directory = tmp_path / "engines" / "mystery" / "1"
    _fake_llama_server(directory)
    write_marker(directory, "mystery", "1", "llama-server", "")
    facts = gather.gather_facts(tmp_path, "node-a", "127.0.0.1")
    assert facts.engines[0].runnable is None
    assert "unknown engine 'mystery'" in facts.engines[0].detail
