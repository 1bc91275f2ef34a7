"""vLLM's `vllm serve`: the command line and environment for one replica. Pure.

The API key travels as VLLM_API_KEY, never `--api-key` (every user of the node can read a
command line in /proc). vLLM guards only /v1 (and /v2, /inference) with it: /metrics and
/health stay open, so the port must never be exposed beyond the node.
"""

from __future__ import annotations

from workflows.contracts import ModelSpec

API_KEY_ENV = "VLLM_API_KEY"
# The CPU attention backend refuses 16 (vLLM's GPU default); 32 and its multiples work.
CPU_BLOCK_SIZE = 32

RESERVED_FLAGS = frozenset(
    {
        "--host",
        "--port",
        "--api-key",
        "--served-model-name",
        "--model",
        "--max-model-len",
        "--max-num-seqs",
    }
)


def command_line(
    entrypoint: str, model: ModelSpec, host: str, port: int, *, cpu: bool
) -> list[str]:
    """argv for `vllm serve` of the model directory `model.weights` on host:port.

    On the CPU: `--block-size 32` (16 is refused there) and `--enforce-eager` (graph capture
    is a GPU feature that only costs start-up time on the CPU)."""
    clash = sorted({arg.split("=", 1)[0] for arg in model.args} & RESERVED_FLAGS)
    if clash:
        raise ValueError(
            f"model {model.name}: args may not set {', '.join(clash)}; llmgw sets them itself"
        )
    argv = [
        entrypoint,
        "serve",
        model.weights,
        "--host",
        host,
        "--port",
        str(port),
        # Responses and /v1/models name the model as clients asked for it, not by directory.
        "--served-model-name",
        model.name,
        "--max-model-len",
        str(model.context_size),
        "--max-num-seqs",
        str(model.parallel),
    ]
    if cpu:
        argv += ["--block-size", str(CPU_BLOCK_SIZE), "--enforce-eager"]
    return [*argv, *model.args]


def engine_env(key: str, model: ModelSpec, *, cpu: bool) -> dict[str, str]:
    """The key, no hub access (weights are local), and on the CPU a KV cache sized from the
    model's memory budget: half of it, in whole GiB, at least one."""
    env = {API_KEY_ENV: key, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if cpu:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, model.memory_mb // 2048))
        env["OMP_NUM_THREADS"] = str(model.cpu_cores)
    return env
