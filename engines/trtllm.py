"""TensorRT-LLM: brought by the operator (built for their GPUs and CUDA), never installed by
llmgw. The operator names `trtllm-serve`; it is checked to run, and its version is read from
the `tensorrt_llm` package of the Python beside it when there is one. Also its command line and
its adapter.

A shard is two processes. `trtllm-serve` has no API-key option at all (NVIDIA/TensorRT-LLM#9950),
so it listens on loopback, on the shard's inner port (placement's ENGINE_INNER), and llmgw's key
guard (engines/key_guard.py, a sidecar) holds the shard's address and port in front of it,
refusing every request without the engine key as the other engines do. The key is in the
guard's environment alone.

Its Prometheus metrics (/prometheus/metrics) are served only when the LLM API option
`return_perf_metrics` is set, and the gauges llmgw reads (requests running and waiting, KV-cache
use) are iteration stats, which the PyTorch backend (trtllm-serve's default) collects only with
`enable_iter_perf_stats` (the TensorRT backend always does, and refuses that option as unknown).
trtllm-serve takes such options only from a YAML file, `--extra_llm_api_options` (alias
`--config`): llmgw names one that ships beside this module, so it exists before any shard starts
and the adapter stays pure. trtllm-serve reads one such file only, so a profile's args may not
name their own (refused, not merged: llmgw reads no operator YAML).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from typing_extensions import override

from engines.adapter import Engine, InstallPlace, Progress, ShardLaunch
from engines.commands import Command, ShardPlace, check_reserved
from engines.key_guard import KEY_ENV
from engines.python_env import CHECK_TIMEOUT_S, check_env
from engines.verify import Verification
from workflows.contracts import EngineRequirement, EngineState, EngineStatus, ModelSpec, Profile
from workflows.engine_plan import TRTLLM
from workflows.placement.ports import ENGINE_INNER

HERE = Path(__file__).resolve().parent
KEY_GUARD = HERE / "key_guard.py"
# The LLM API options llmgw gives trtllm-serve, by backend (shipped as package data).
LLM_API_OPTIONS = HERE / "trtllm_options.yaml"
LLM_API_OPTIONS_TENSORRT = HERE / "trtllm_options_tensorrt.yaml"
LOOPBACK = "127.0.0.1"
OPTIONS_FLAGS = frozenset({"--extra_llm_api_options", "--config"})

# Flags llmgw sets on `trtllm-serve` (one node: multi-node TensorRT-LLM runs under MPI, which
# llmgw does not drive; the catalog refuses nodes > 1).
RESERVED_FLAGS = frozenset(
    {
        "--host",
        "--port",
        "--tp_size",
        "--pp_size",
        "--max_seq_len",
        "--max_batch_size",
        *OPTIONS_FLAGS,
    }
)

_VERSION_PROBE = "import tensorrt_llm; print(tensorrt_llm.__version__)"


def _run(command: list[str]) -> subprocess.CompletedProcess[str] | str:
    try:
        return subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            env=check_env(),
            check=False,
        )
    except (subprocess.TimeoutExpired, OSError) as err:
        return f"{Path(command[0]).name} could not run: {err}"


def check_trtllm(req: EngineRequirement) -> EngineStatus:
    def failed(reason: str) -> EngineStatus:
        return EngineStatus(
            engine=TRTLLM, version=req.version, state=EngineState.FAILED, detail=reason
        )

    if not req.path:
        return failed("TensorRT-LLM is brought by the operator: no path is configured")
    serve = Path(req.path).expanduser()
    if serve.is_dir():
        serve = serve / "bin" / "trtllm-serve"
    if not serve.is_file():
        return failed(f"{serve} does not exist")
    helped = _run([str(serve), "--help"])
    if isinstance(helped, str):
        return failed(helped)
    if helped.returncode != 0:
        tail = (helped.stderr + helped.stdout).strip()[-600:]
        return failed(f"{serve.name} --help exited {helped.returncode}: {tail}")
    detail = f"{serve.name} --help exited 0"
    python = serve.parent / "python"
    if python.is_file():
        probed = _run([str(python), "-c", _VERSION_PROBE])
        if not isinstance(probed, str) and probed.returncode == 0 and probed.stdout.strip():
            detail = f"tensorrt_llm {probed.stdout.strip().splitlines()[-1]}"
    return EngineStatus(
        engine=TRTLLM,
        version=req.version,
        state=EngineState.INSTALLED,
        path=str(serve),
        detail=detail,
    )


def backend(args: list[str]) -> str:
    """The backend the profile's args choose; trtllm-serve's default is PyTorch."""
    chosen = "pytorch"
    for i, arg in enumerate(args):
        if arg == "--backend" and i + 1 < len(args):
            chosen = args[i + 1]
        elif arg.startswith("--backend="):
            chosen = arg.split("=", 1)[1]
    return chosen


def llm_api_options(profile: Profile) -> Path:
    tensorrt = backend(profile.args) in ("tensorrt", "trt")
    return LLM_API_OPTIONS_TENSORRT if tensorrt else LLM_API_OPTIONS


def command_line(
    serve: str, model: ModelSpec, profile: Profile, place: ShardPlace, inner_port: int
) -> list[str]:
    """argv for `trtllm-serve` of `model.weights` on loopback at `inner_port`, behind the key
    guard (guard_command), with llmgw's LLM API options (its metrics switched on)."""
    named = sorted({arg.split("=", 1)[0] for arg in profile.args} & OPTIONS_FLAGS)
    if named:
        raise ValueError(
            f"model {model.name}: args may not set {', '.join(named)}: llmgw gives trtllm-serve "
            f"its own LLM API options file ({LLM_API_OPTIONS.name}, which switches its "
            "Prometheus metrics on), and trtllm-serve reads only one"
        )
    check_reserved(model.name, profile.args, RESERVED_FLAGS)
    if place.multi_node:
        raise ValueError(f"model {model.name}: trtllm replicas run on one node")
    return [
        serve,
        model.weights,
        "--host",
        LOOPBACK,
        "--port",
        str(inner_port),
        "--tp_size",
        str(profile.tensor_parallel),
        "--pp_size",
        str(profile.pipeline_parallel),
        "--max_seq_len",
        str(profile.context_size),
        "--max_batch_size",
        str(profile.parallel),
        "--extra_llm_api_options",
        str(llm_api_options(profile)),
        *profile.args,
    ]


def guard_command(place: ShardPlace, inner_port: int, python: str = sys.executable) -> list[str]:
    """argv for the key guard on the shard's address and port, relaying to trtllm-serve (run by
    the agent's own Python, isolated: the guard needs only the standard library)."""
    listen = f"[{place.address}]" if ":" in place.address else place.address
    return [
        python,
        "-I",
        str(KEY_GUARD),
        "--listen",
        f"{listen}:{place.port}",
        "--upstream",
        f"{LOOPBACK}:{inner_port}",
    ]


class TrtLlm(Engine):
    name = TRTLLM

    @override
    def install(
        self, req: EngineRequirement, where: InstallPlace, progress: Progress
    ) -> EngineStatus:
        return check_trtllm(req)  # checked where the operator put it, never installed

    @override
    def reverify(self, path: Path, version: str, where: InstallPlace) -> Verification:
        checked = check_trtllm(EngineRequirement(engine=TRTLLM, version=version, path=str(path)))
        return Verification(checked.state is EngineState.INSTALLED, checked.detail)

    @override
    def commands(self, shard: ShardLaunch) -> list[Command]:
        """The key guard, then trtllm-serve once the guard listens. trtllm-serve is last, so the
        shard's exit is the engine's own (its code or signal is what the exit reason and the
        restart policy read); the guard is a sidecar, and a guard that dies stops the shard
        (activities/agent/shard_launcher.py), so no shard runs unguarded or unreachable. Up
        first, the guard answers the agent's readiness probes at once: 502 until trtllm-serve
        answers behind it, never a refused connection."""
        inner = shard.ports.get(ENGINE_INNER)
        if inner is None:
            raise ValueError(
                f"model {shard.model.name}: trtllm-serve needs its {ENGINE_INNER} port from "
                "placement (it listens on loopback behind the key guard)"
            )
        binary = shard.binary
        serve = binary if binary.name == "trtllm-serve" else binary.parent / "trtllm-serve"
        place = shard.place
        return [
            Command(guard_command(place, inner)),
            Command(
                command_line(str(serve), shard.model, shard.profile, place, inner),
                wait_for=(place.address, place.port),
                env_drop=(KEY_ENV,),  # the key is the guard's alone
            ),
        ]

    @override
    def environment(self, shard: ShardLaunch) -> dict[str, str]:
        return {KEY_ENV: shard.key}  # for the key guard; dropped from trtllm-serve's
