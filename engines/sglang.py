"""SGLang's server: the command line and environment for one shard of a replica (pure), and the
engine's adapter, which installs it as a Python environment (python_env.py).

SGLang takes its API key only as `--api-key` on the command line, which every user of the node
can read in /proc. So the shard runs a small llmgw launcher instead of
`python -m sglang.launch_server` directly: it takes the key from SGLANG_API_KEY (removing it
from the environment the server and its workers inherit), appends `--api-key` to the server's
own argument list in memory, and runs the same module. /proc/<pid>/cmdline keeps the argv the
process was started with, which has no key.

Multi-node: every node runs the server with `--nnodes N --node-rank R --dist-init-addr
LEADER:PORT`; only rank 0 serves HTTP.

GPUs only: the command line is a GPU server's (no `--device cpu`). SGLang's CPU engine needs
sgl-kernel's CPU build, which no package on PyPI holds and which needs AVX-512 and AMX; the
engine plan says so to a node without a GPU (docs/nodes.md, "SGLang on a CPU node").
"""

from __future__ import annotations

from engines.adapter import ShardLaunch
from engines.commands import Command, ShardPlace, check_reserved
from engines.python_env import PythonEnvEngine
from workflows.contracts import ModelSpec, Profile
from workflows.engine_plan import SGLANG

API_KEY_ENV = "SGLANG_API_KEY"
MODULE = "sglang.launch_server"
# Run with `python -I -c`: isolated (no PYTHON* variables, no user site, no script directory
# on sys.path), so only the engine's own environment is imported.
LAUNCHER = (
    "import os, runpy, sys; "
    f"key = os.environ.pop({API_KEY_ENV!r}, ''); "
    "sys.argv = [sys.argv[0], *sys.argv[1:], *(['--api-key', key] if key else [])]; "
    f"runpy.run_module({MODULE!r}, run_name='__main__', alter_sys=True)"
)

RESERVED_FLAGS = frozenset(
    {
        "--model-path",
        "--model",
        "--host",
        "--port",
        "--api-key",
        "--served-model-name",
        "--context-length",
        "--max-running-requests",
        "--tp",
        "--tp-size",
        "--tensor-parallel-size",
        "--pp",
        "--pp-size",
        "--pipeline-parallel-size",
        "--dp",
        "--dp-size",
        "--data-parallel-size",
        "--nnodes",
        "--node-rank",
        "--dist-init-addr",
        "--enable-metrics",
        "--lora-paths",
        "--enable-lora",
        "--quantization",
    }
)


def command_line(python: str, model: ModelSpec, profile: Profile, place: ShardPlace) -> list[str]:
    """argv for this shard's SGLang server (through the key launcher above)."""
    check_reserved(model.name, profile.args, RESERVED_FLAGS)
    argv = [
        python,
        "-I",
        "-c",
        LAUNCHER,
        "--model-path",
        model.weights,
        "--host",
        place.address,
        "--port",
        str(place.port),
        "--served-model-name",
        model.name,
        "--context-length",
        str(profile.context_size),
        "--max-running-requests",
        str(profile.parallel),
        "--enable-metrics",
        "--tp",
        str(profile.tensor_parallel),
    ]
    if profile.pipeline_parallel > 1:
        argv += ["--pp-size", str(profile.pipeline_parallel)]
    if profile.quantization:
        argv += ["--quantization", profile.quantization]
    if place.multi_node:
        argv += [
            "--nnodes",
            str(place.nodes),
            "--node-rank",
            str(place.rank),
            "--dist-init-addr",
            f"{place.leader}:{place.rendezvous_port}",
        ]
    if profile.lora:
        argv += ["--enable-lora", "--lora-paths"]
        argv += [f"{adapter.name}={adapter.path}" for adapter in profile.lora]
    return [*argv, *profile.args]


def engine_env(key: str) -> dict[str, str]:
    """The key, for the launcher to take out again; no hub access (weights are local)."""
    return {API_KEY_ENV: key, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


class SGLang(PythonEnvEngine):
    name = SGLANG

    def commands(self, shard: ShardLaunch) -> list[Command]:
        # The launcher above runs under the environment's own python, found beside whatever
        # entry point the install (or the operator) named.
        binary = shard.binary
        python = binary if binary.name.startswith("python") else binary.parent / "python"
        return [Command(command_line(str(python), shard.model, shard.profile, shard.place))]

    def environment(self, shard: ShardLaunch) -> dict[str, str]:
        return engine_env(shard.key)
