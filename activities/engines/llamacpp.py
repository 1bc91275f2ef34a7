"""llama.cpp's llama-server: the command line and environment for one replica. Pure.

Only flags that `llama-server --help` of the pinned build lists are used; anything else makes
the server exit at start-up with "invalid argument".
"""

from __future__ import annotations

from activities.engines.commands import check_reserved
from workflows.contracts import ModelSpec, Profile

# The default version lives with the cluster's engine plan (workflows may not import
# activities); re-exported here for the agent's callers.
from workflows.engine_plan import LLAMACPP as ENGINE
from workflows.engine_plan import LLAMACPP_DEFAULT_VERSION

__all__ = [
    "API_KEY_ENV",
    "ENGINE",
    "LLAMACPP_DEFAULT_VERSION",
    "RESERVED_FLAGS",
    "command_line",
    "engine_env",
]
API_KEY_ENV = "LLAMA_API_KEY"
# Every layer on the GPUs placement gave the shard: more than any model has.
ALL_LAYERS = "999"

# Flags llmgw itself decides. An operator's extra args may not override them: a second --port
# would make the engine listen where nothing routes, and --api-key would put a secret on the
# command line, which every user of the node can read in /proc.
RESERVED_FLAGS = frozenset(
    {
        "--host",
        "--port",
        "--api-key",
        "--api-key-file",
        "-m",
        "--model",
        "--metrics",
        "-a",
        "--alias",
        "--lora",
        "--lora-init-without-apply",
    }
)


def command_line(
    binary: str, model: ModelSpec, profile: Profile, host: str, port: int, threads: int
) -> list[str]:
    """argv for llama-server serving `model` as `profile` says, on host:port with `threads` CPU
    threads.

    Host and port are always explicit because their defaults changed across builds. On GPUs
    every layer is offloaded (`-ngl`): a CUDA build left to guess may compute on the CPU. LoRA
    adapters load unapplied (scale 0); a request selects one by its index."""
    check_reserved(model.name, profile.args, RESERVED_FLAGS)
    argv = [
        binary,
        "--host",
        host,
        "--port",
        str(port),
        "--metrics",
        "-m",
        model.weights,
        # Responses and /v1/models name the model as clients asked for it, not by file path.
        "--alias",
        model.name,
        "-c",
        str(profile.context_size),
        "-np",
        str(profile.parallel),
        "-t",
        str(threads),
    ]
    if profile.gpu_class is not None:
        argv += ["-ngl", ALL_LAYERS]
    if profile.lora:
        for adapter in profile.lora:
            argv += ["--lora", adapter.path]
        argv.append("--lora-init-without-apply")
    return [*argv, *profile.args]


def engine_env(key: str) -> dict[str, str]:
    """The engine key travels in the environment, readable only by the process's own user."""
    return {API_KEY_ENV: key}
