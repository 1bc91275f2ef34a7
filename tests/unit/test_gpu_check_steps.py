"""The GPU check's steps where no GPU is needed: discovery on this machine, recorded and read
back; the GPU steps skipping with the reason on a machine without one; the fixture's name."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench.gpu_check import gpu_steps, machine_steps
from bench.gpu_check.recorder import read_expected
from bench.gpu_check.runner import Budget, Failed, Outcome, Step, run_steps
from bench.gpu_check.state import NO_GPU, CheckState
from workflows.contracts import GpuInfo, NodeInventory


def state(tmp_path: Path, **fields: object) -> CheckState:
    values: dict[str, object] = {
        "out": tmp_path / "out",
        "machines": tmp_path / "machines",
        "name": "",
        "node": "check-node",
        "address": "127.0.0.1",
        "vllm_version": "0.32.0",
    }
    values.update(fields)
    found = CheckState(**values)  # type: ignore[arg-type]
    found.out.mkdir(parents=True, exist_ok=True)
    return found


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a CPU machine's test")
async def test_discovery_records_this_machine_and_reads_it_back(tmp_path: Path) -> None:
    checked = state(tmp_path)
    detail = await machine_steps.discovery(checked)
    assert checked.inventory is not None
    assert checked.fixture == tmp_path / "machines" / f"cpu_{checked.inventory.arch}_recorded"
    assert detail.startswith("no NVIDIA GPU: a CPU node")
    assert detail.endswith(f"fixture {checked.fixture.name} reproduces it")
    expected = read_expected(checked.fixture)
    assert expected["memory_mb"] == checked.inventory.memory_mb > 0
    assert (checked.fixture / "proc" / "cpuinfo").is_file()


async def test_without_a_gpu_every_gpu_step_skips_saying_so(tmp_path: Path) -> None:
    checked = state(tmp_path)
    checked.inventory = NodeInventory(name="n", address="127.0.0.1")
    runs = {
        "nvml-telemetry": gpu_steps.nvml_telemetry,
        "vllm-install": gpu_steps.vllm_install,
        "doctor-vllm": gpu_steps.doctor_vllm,
        "model-unpack": gpu_steps.model_unpack,
        "serve": gpu_steps.serve,
        "kv-blocks": gpu_steps.kv_blocks,
    }
    steps = [Step(name, lambda run=run: run(checked), 5.0) for name, run in runs.items()]  # type: ignore[misc]
    results = await run_steps(steps, Budget(30))
    assert [(r.outcome, r.detail) for r in results] == [(Outcome.SKIP, NO_GPU)] * len(runs)


def test_the_engine_gets_the_first_usable_gpu(tmp_path: Path) -> None:
    def gpu(index: int, unusable: str = "") -> GpuInfo:
        return GpuInfo(
            index=index,
            uuid=f"GPU-{index}",
            name="NVIDIA H100 80GB HBM3",
            gpu_class="h100-80g",
            memory_mb=81559,
            unusable=unusable,
        )

    checked = state(tmp_path)
    checked.inventory = NodeInventory(
        name="n", address="127.0.0.1", gpus=[gpu(0, "3 uncorrected ECC errors"), gpu(1)]
    )
    chosen = checked.gpu()
    assert chosen is not None
    assert chosen.index == 1
    assert machine_steps.fixture_name(checked.inventory) == "h100_80g_x2_recorded"


def test_a_recording_takes_a_free_name(tmp_path: Path) -> None:
    (tmp_path / "h100_80g_x1_recorded").mkdir()
    (tmp_path / "h100_80g_x1_recorded_2").mkdir()
    assert machine_steps.free_name(tmp_path, "h100_80g_x1_recorded") == "h100_80g_x1_recorded_3"
    assert machine_steps.free_name(tmp_path, "l40s_45g_x1_recorded") == "l40s_45g_x1_recorded"


def test_the_vllm_installed_follows_the_plans_cuda_rule() -> None:
    def node(driver: str, cuda: str, capability: str = "9.0") -> NodeInventory:
        gpu = GpuInfo(
            index=0,
            uuid="GPU-0",
            name="H100",
            gpu_class="h100-80g",
            memory_mb=81559,
            compute_capability=capability,
        )
        return NodeInventory(name="g", nvidia_driver=driver, cuda_version=cuda, gpus=[gpu])

    # A driver for CUDA 13 takes the default as it is.
    assert gpu_steps.gpu_vllm_version(node("580.65", "13.0"), "0.32.0") == ("0.32.0", "")
    # One for CUDA 12: the last release built on CUDA 12, saying why.
    version, note = gpu_steps.gpu_vllm_version(node("550.54.15", "12.4"), "0.32.0")
    assert version == gpu_steps.LAST_CUDA12_VLLM
    assert note.startswith("vLLM 0.32.0 needs a driver for CUDA 13 or newer")
    # A version the operator named is theirs: one that cannot run fails with the plan's words.
    with pytest.raises(Failed, match=r"vLLM 0\.25\.0 needs a driver for CUDA 13"):
        gpu_steps.gpu_vllm_version(node("550.54.15", "12.4"), "0.25.0")
    # Too old a card for any build the fallback would fix: fails.
    with pytest.raises(Failed, match=r"compute capability 7\.5"):
        gpu_steps.gpu_vllm_version(node("580.65", "13.0", capability="6.1"), "0.32.0")
