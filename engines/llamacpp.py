"""llama.cpp's llama-server: the command line and environment for one replica (pure), and the
engine's adapter, which installs it through install_llamacpp.py.

Only flags that `llama-server --help` of the pinned build lists are used; anything else makes
the server exit at start-up with "invalid argument".
"""

from __future__ import annotations

from pathlib import Path

from typing_extensions import override

from engines.adapter import Engine, InstallPlace, Progress, ShardLaunch
from engines.commands import Command, check_reserved
from engines.install_llamacpp import install_llamacpp
from engines.verify import Verification, verify_llamacpp
from workflows.contracts import EngineRequirement, EngineStatus, ModelSpec, Profile

# The default version lives with the cluster's engine plan (workflows may not import
# activities); re-exported here for the agent's callers.
from workflows.engine_plan import LLAMACPP as ENGINE
from workflows.engine_plan import LLAMACPP_DEFAULT_VERSION

__all__ = [
    "API_KEY_ENV",
    "ENGINE",
    "LLAMACPP_DEFAULT_VERSION",
    "RESERVED_FLAGS",
    "LlamaCpp",
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
    adapters load unapplied (scale 0), in profile.lora order: llama-server applies one only to
    a request whose `lora` field lists its index in that order, which the gateway sets for a
    request naming `<model>:<adapter>` (gateway/lora.py) and refuses from clients."""
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


class LlamaCpp(Engine):
    name = ENGINE

    @override
    def install(
        self, req: EngineRequirement, where: InstallPlace, progress: Progress
    ) -> EngineStatus:
        return install_llamacpp(
            req, where.engines_root, where.cache_dir, progress, where.nvidia, where.os_packages
        )

    @override
    def reverify(self, path: Path, version: str, where: InstallPlace) -> Verification:
        return verify_llamacpp(path)

    @override
    def commands(self, shard: ShardLaunch) -> list[Command]:
        # The shard's own cores when placement counted them, else the profile's.
        threads = shard.place.cpu_cores or shard.profile.cpu_cores
        argv = command_line(
            str(shard.binary),
            shard.model,
            shard.profile,
            shard.place.address,
            shard.place.port,
            threads,
        )
        return [Command(argv)]

    @override
    def environment(self, shard: ShardLaunch) -> dict[str, str]:
        return engine_env(shard.key)
