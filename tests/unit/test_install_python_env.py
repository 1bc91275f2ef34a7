"""The Python-engine installer's edges, without the 3.5 GB vLLM environment (the e2e test
tests/e2e/test_vllm_cpu.py installs that one)."""

from pathlib import Path

import pytest

from engines.adapter import InstallPlace
from engines.python_env import (
    add_distribution_record,
    env_is_cpu_build,
    install_python_engine,
)
from engines.registry import adapter
from workflows.contracts import EngineRequirement, EngineState


class Lines(list[str]):
    def __call__(self, line: str) -> None:
        self.append(line)


def test_a_version_pip_cannot_find_fails_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # offline and certain: nothing matches
    progress = Lines()
    req = EngineRequirement(engine="sglang", version="0.0.0", package="no-such-engine-pkg")
    status = install_python_engine(req, tmp_path / "e", tmp_path / "c", progress, nvidia=False)
    assert status.state is EngineState.FAILED
    assert "No matching distribution" in status.detail
    assert list((tmp_path / "e" / "sglang").iterdir()) == [
        tmp_path / "e" / "sglang" / ".0.0.0.lock"
    ]
    assert "installing no-such-engine-pkg==0.0.0" in progress


@pytest.mark.parametrize(
    ("version", "package", "why"),
    [("../../x", None, "invalid sglang version"), ("1.0", "pkg; rm -rf /", "invalid package")],
)
def test_names_that_could_escape_are_refused(
    tmp_path: Path, version: str, package: str | None, why: str
) -> None:
    req = EngineRequirement(engine="sglang", version=version, package=package)
    status = install_python_engine(req, tmp_path, tmp_path, Lines(), nvidia=False)
    assert status.state is EngineState.FAILED
    assert why in status.detail


def test_a_cpu_package_of_sglang_is_refused_with_the_reason_before_pip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # were pip asked, it would fail differently
    progress = Lines()
    req = EngineRequirement(engine="sglang", version="0.5.23", package="sglang-cpu")
    status = install_python_engine(req, tmp_path / "e", tmp_path / "c", progress, nvidia=True)
    assert status.state is EngineState.FAILED
    assert status.detail.startswith("sglang-cpu: llmgw cannot install SGLang for the CPU: ")
    assert "PyPI does not publish" in status.detail
    assert progress == []  # no environment made, pip never run
    assert not (tmp_path / "e").exists()


def test_an_sglang_environment_on_a_node_without_a_gpu_fails_its_check_saying_why(
    tmp_path: Path,
) -> None:
    """What the agent's re-verification and `llmgw doctor` report for an SGLang environment
    on a CPU node: the plan's reason, not `sglang 0.5.23` as if it could serve."""
    entry = tmp_path / "venv" / "bin" / "python"
    place = InstallPlace(engines_root=tmp_path, cache_dir=tmp_path, nvidia=False)
    check = adapter("sglang").reverify(entry, "0.5.23", place)
    assert not check.ok
    assert check.detail.startswith("SGLang needs an NVIDIA GPU: SGLang's CPU engine needs")
    # vLLM has a CPU build: its environment is looked at (here: there is none).
    vllm = adapter("vllm").reverify(tmp_path / "venv" / "bin" / "vllm", "0.32.0", place)
    assert not vllm.ok
    assert "does not exist" in vllm.detail


def test_cpu_build_is_recognised_by_its_distribution_record(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    add_distribution_record(venv, "vllm", "0.32.0+cpu")
    assert not env_is_cpu_build(venv)
    add_distribution_record(venv, "vllm_cpu", "0.32.0")
    assert env_is_cpu_build(venv)


def test_operator_environment_that_does_not_run_is_reported(tmp_path: Path) -> None:
    req = EngineRequirement(engine="vllm", version="0.32.0", path=str(tmp_path / "nowhere"))
    status = install_python_engine(req, tmp_path, tmp_path, Lines(), nvidia=False)
    assert status.state is EngineState.FAILED
    assert "does not exist" in status.detail
