"""TensorRT-LLM: brought by the operator (built for their GPUs and CUDA), never installed by
llmgw. The operator names `trtllm-serve`; it is checked to run, and its version is read from
the `tensorrt_llm` package of the Python beside it when there is one."""

from __future__ import annotations

import subprocess
from pathlib import Path

from activities.engines.commands import ShardPlace, check_reserved
from activities.engines.python_env import CHECK_TIMEOUT_S, check_env
from workflows.contracts import EngineRequirement, EngineState, EngineStatus, ModelSpec, Profile
from workflows.engine_plan import TRTLLM

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


def command_line(serve: str, model: ModelSpec, profile: Profile, place: ShardPlace) -> list[str]:
    """argv for `trtllm-serve` of `model.weights` on this node's address and port.

    trtllm-serve checks no API key: its port must stay on the node's own address, reached
    only through the gateway."""
    check_reserved(model.name, profile.args, RESERVED_FLAGS)
    if place.multi_node:
        raise ValueError(f"model {model.name}: trtllm replicas run on one node")
    return [
        serve,
        model.weights,
        "--host",
        place.address,
        "--port",
        str(place.port),
        "--tp_size",
        str(profile.tensor_parallel),
        "--pp_size",
        str(profile.pipeline_parallel),
        "--max_seq_len",
        str(profile.context_size),
        "--max_batch_size",
        str(profile.parallel),
        *profile.args,
    ]
