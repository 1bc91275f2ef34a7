"""The GPU launch the check asks the node agent for (bench/kv_fleet.launch_request with
EngineSettings.gpu): the replica on that GPU by its UUID, vLLM's GPU command line with KV events
at the block size the router hashes; and the KV benchmark's CPU launch as it was."""

from __future__ import annotations

from pathlib import Path

from bench.gpu_check.gpu_steps import ENGINE_ARGS
from bench.kv_fleet import CPU_BUILD, EngineSettings, launch_request
from engines.commands import ShardPlace
from engines.vllm import GPU_BLOCK_SIZE, command_line, engine_env
from workflows.contracts import GpuInfo
from workflows.placement.ports import KV_PUB, KV_REPLAY

H100 = GpuInfo(
    index=0,
    uuid="GPU-5e1f0c2a-93b4-4d7e-a1c6-0f2b8d9e7a11",
    name="NVIDIA H100 80GB HBM3",
    gpu_class="h100-80g",
    memory_mb=81559,
)
KV_PORTS = {KV_PUB: 18101, KV_REPLAY: 18102}


def test_the_gpu_replica_runs_on_its_card_with_kv_events_at_the_gpu_block_size() -> None:
    settings = EngineSettings(gpu=H100, cpu_cores=2, args=ENGINE_ARGS)
    request = launch_request(Path("/m/smollm2"), "gpu-check-0", 18100, KV_PORTS, settings, 0)
    (profile,) = request.model.profiles
    (shard,) = request.allocation.shards
    assert (profile.gpu_class, profile.gpus_per_node) == ("h100-80g", 1)
    assert (shard.gpus, shard.gpu_uuids) == ([0], [H100.uuid])
    assert "VLLM_CPU_OMP_THREADS_BIND" not in profile.env  # a CPU build's setting
    place = ShardPlace(address="127.0.0.1", port=18100, gpus=[H100.uuid])
    argv = command_line("vllm", request.model, profile, place, cpu=False, kv_ports=(18101, 18102))
    assert argv[argv.index("--block-size") + 1] == str(GPU_BLOCK_SIZE)
    assert "--kv-events-config" in argv
    assert argv[-1] == "--enforce-eager"
    assert "VLLM_CPU_KVCACHE_SPACE" not in engine_env("k", profile, place, cpu=False)


def test_the_kv_benchmarks_cpu_replica_is_as_before() -> None:
    request = launch_request(Path("/m/smollm2"), "kv-bench-0", 18100, KV_PORTS, EngineSettings(), 3)
    (profile,) = request.model.profiles
    (shard,) = request.allocation.shards
    assert profile.gpu_class is None
    assert (shard.gpus, shard.gpu_uuids) == ([], [])
    assert profile.env == {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_OMP_THREADS_BIND": "3"}
    assert profile.args == []
    assert (CPU_BUILD.package, CPU_BUILD.nvidia) == ("vllm-cpu", False)
