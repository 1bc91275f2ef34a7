"""vLLM's command line and environment: the key stays off the command line, the CPU fixes are
there on the CPU only, and an operator's args cannot take over what llmgw decides."""

import pytest

from activities.engines.vllm import command_line, engine_env
from workflows.contracts import ModelSpec


def spec(**kw) -> ModelSpec:  # type: ignore[no-untyped-def]
    return ModelSpec(name="tiny", engine="vllm", weights="/models/tiny", **kw)


def test_cpu_command_line() -> None:
    argv = command_line(
        "/e/venv/bin/vllm", spec(context_size=2048, parallel=4), "10.0.0.1", 18001, cpu=True
    )
    assert argv[:3] == ["/e/venv/bin/vllm", "serve", "/models/tiny"]
    pairs = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert pairs["--host"] == "10.0.0.1" and pairs["--port"] == "18001"
    assert pairs["--served-model-name"] == "tiny"
    assert pairs["--max-model-len"] == "2048" and pairs["--max-num-seqs"] == "4"
    assert argv[argv.index("--block-size") + 1] == "32"
    assert "--enforce-eager" in argv


def test_gpu_command_line_keeps_vllms_own_defaults() -> None:
    argv = command_line("vllm", spec(), "127.0.0.1", 1, cpu=False)
    assert "--block-size" not in argv and "--enforce-eager" not in argv


def test_extra_args_follow_and_cannot_override() -> None:
    argv = command_line("vllm", spec(args=["--enable-prefix-caching"]), "h", 1, cpu=True)
    assert argv[-1] == "--enable-prefix-caching"
    for bad in (["--api-key", "x"], ["--port=9"], ["--served-model-name", "other"]):
        with pytest.raises(ValueError, match="llmgw sets them itself"):
            command_line("vllm", spec(args=bad), "h", 1, cpu=True)


def test_key_only_in_the_environment() -> None:
    argv = command_line("vllm", spec(), "h", 1, cpu=True)
    env = engine_env("sekrit-key", spec(memory_mb=8192, cpu_cores=3), cpu=True)
    assert "sekrit-key" not in " ".join(argv)
    assert env["VLLM_API_KEY"] == "sekrit-key"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert env["OMP_NUM_THREADS"] == "3"
    assert engine_env("k", spec(memory_mb=512), cpu=True)["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "VLLM_CPU_KVCACHE_SPACE" not in engine_env("k", spec(), cpu=False)
