"""Verification beyond `--version`: a CUDA build of llama.cpp must list a CUDA device, and the
agent's scheduled re-verification reports a later failure instead of the first success."""

from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.agent.node_agent import AgentConfig, NodeAgentActivities
from engines.verify import verify_llamacpp
from workflows.contracts import (
    EngineInstallRequest,
    EngineRequirement,
    EngineState,
    EngineStatus,
    VerifyEnginesRequest,
)


def fake_server(directory: Path, devices: str, cuda: bool = True) -> Path:
    """A llama-server stand-in; a `libggml-cuda.so` beside it makes it a CUDA build."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "llama-server"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--list-devices" ]; then printf "Available devices:\\n'
        + devices
        + '"; exit 0; fi\n'
        "echo 'version: 7 (fake cuda)' >&2\n"
    )
    script.chmod(0o755)
    if cuda:
        (directory / "libggml-cuda.so").write_bytes(b"")
    return script


def test_cuda_build_listing_a_cuda_device_is_installed(tmp_path: Path) -> None:
    server = fake_server(tmp_path, "  CUDA0: NVIDIA H200 (143771 MiB, 143000 MiB free)\\n")
    check = verify_llamacpp(server)
    assert check.ok, check.detail
    assert check.detail == "version: 7 (fake cuda)"
    assert any("CUDA0 NVIDIA H200 (143771 MiB)" in note for note in check.notes)


def test_cuda_build_that_fell_back_to_the_cpu_is_not_installed(tmp_path: Path) -> None:
    check = verify_llamacpp(fake_server(tmp_path, "  (none)\\n"))
    assert not check.ok
    assert "lists no CUDA device" in check.detail


def test_cpu_build_is_not_asked_for_devices(tmp_path: Path) -> None:
    check = verify_llamacpp(fake_server(tmp_path, "  (none)\\n", cuda=False))
    assert check.ok
    assert not any("devices" in note for note in check.notes)


def agent(tmp_path: Path, paths: dict[str, str] | None = None) -> NodeAgentActivities:
    return NodeAgentActivities(
        AgentConfig(
            node="n",
            address="127.0.0.1",
            state_dir=tmp_path / "state",
            cache_dir=tmp_path / "cache",
            node_secret=b"s" * 32,
            engine_paths=paths or {},
            nvidia=False,
        )
    )


async def test_reverify_moves_verified_at_then_reports_a_later_failure(tmp_path: Path) -> None:
    server = fake_server(tmp_path / "bin", "", cuda=False)
    acts = agent(tmp_path)
    env = ActivityEnvironment()
    beats: list[object] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    installed = EngineStatus(
        engine="llamacpp", version="7", state=EngineState.INSTALLED, path=str(server)
    )
    unavailable = EngineStatus(
        engine="vllm", version="1", state=EngineState.UNAVAILABLE, detail="needs a GPU"
    )
    first = await env.run(
        acts.verify_engines, VerifyEnginesRequest(node="n", engines=[installed, unavailable])
    )
    ok, untouched = first.engines
    assert ok.state is EngineState.INSTALLED
    assert ok.verified_at
    assert untouched == unavailable
    assert beats

    # An upgrade elsewhere broke it: the next round says so, with the reason.
    server.write_text("#!/bin/sh\necho 'libgomp.so.1: cannot open shared object' >&2\nexit 127\n")
    (broken,) = (
        await env.run(acts.verify_engines, VerifyEnginesRequest(node="n", engines=[ok]))
    ).engines
    assert broken.state is EngineState.FAILED
    assert broken.detail.startswith("re-verification failed: llama-server --version exited 127")
    assert "libgomp" in broken.detail

    # The library is put back: the next round finds it running and says installed again.
    fake_server(tmp_path / "bin", "", cuda=False)
    (fixed,) = (
        await env.run(acts.verify_engines, VerifyEnginesRequest(node="n", engines=[broken]))
    ).engines
    assert fixed.state is EngineState.INSTALLED
    assert fixed.verified_at


async def test_reverify_refuses_another_nodes_request(tmp_path: Path) -> None:
    with pytest.raises(ApplicationError, match="reached agent n"):
        await ActivityEnvironment().run(
            agent(tmp_path).verify_engines, VerifyEnginesRequest(node="other")
        )


async def test_trtllm_is_checked_never_installed(tmp_path: Path) -> None:
    serve = tmp_path / "trt" / "bin" / "trtllm-serve"
    serve.parent.mkdir(parents=True)
    serve.write_text("#!/bin/sh\necho 'Usage: trtllm-serve [OPTIONS]'\n")
    serve.chmod(0o755)
    acts = agent(tmp_path, {"trtllm": str(serve)})
    req = EngineInstallRequest(
        node="n", requirement=EngineRequirement(engine="trtllm", version="1.1.0")
    )
    status = await ActivityEnvironment().run(acts.install_engine, req)
    assert status.state is EngineState.INSTALLED, status.detail
    assert status.path == str(serve)
    missing = EngineInstallRequest(
        node="n", requirement=EngineRequirement(engine="trtllm", version="1.1.0")
    )
    none = await ActivityEnvironment().run(agent(tmp_path / "x").install_engine, missing)
    assert none.state is EngineState.FAILED
    assert "brought by the operator" in none.detail
