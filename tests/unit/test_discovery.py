"""Discovery: recorded-shape output of real machine types in, the inventory placement sees out."""

import shutil
from pathlib import Path

import pytest

from activities.agent.discovery import (
    MachinePaths,
    discover_inventory,
    parse_cpuinfo,
    parse_meminfo,
    parse_os_release,
)
from activities.agent.gpu_parsing import NvidiaSmiReport, gpu_class, parse_nvidia_smi_xml
from activities.agent.nvml_source import GpuToolMissing
from tests.machine_tools import recorded_nvidia_smi, write_tool

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
MACHINES = FIXTURES / "machines"


def fixture(*parts: str) -> str:
    return FIXTURES.joinpath(*parts).read_text()


def machine(name: str, file: str = "nvidia_smi_q_x.xml") -> str:
    return (MACHINES / name / file).read_text()


@pytest.mark.parametrize(
    ("product", "mib", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", 81559, "h100-80g"),
        ("NVIDIA A100-SXM4-80GB", 81920, "a100-80g"),
        # Sold as 48GB, reports 44.99 GiB: the class follows the driver, not the box.
        ("NVIDIA L40S", 46068, "l40s-45g"),
        ("Tesla V100-PCIE-32GB", 32768, "v100-32g"),
        ("NVIDIA GeForce RTX 4090", 24564, "rtx-4090-24g"),
        ("NVIDIA RTX A6000", 49140, "rtx-a6000-48g"),
        ("NVIDIA H200", 143771, "h200-140g"),
    ],
)
def test_gpu_class_names_chip_and_driver_memory(product: str, mib: int, expected: str) -> None:
    assert gpu_class(product, mib) == expected


def test_h100_sxm_x8_lists_every_card_in_minor_order() -> None:
    report = parse_nvidia_smi_xml(machine("h100_sxm_x8"))
    assert report.driver_version == "550.54.15"
    assert report.cuda_version == "12.4"
    assert [g.index for g in report.gpus] == list(range(8))
    assert {g.gpu_class for g in report.gpus} == {"h100-80g"}
    assert all(g.memory_mb == 81559 for g in report.gpus)
    assert report.gpus[0].pci_bus_id == "00000000:18:00.0"
    assert report.gpus[7].pci_bus_id == "00000000:DB:00.0"
    uuids = [g.uuid for g in report.gpus]
    assert all(u.startswith("GPU-") for u in uuids)
    assert len(set(uuids)) == 8


def test_l40s_single_card() -> None:
    report = parse_nvidia_smi_xml(machine("l40s_x1"))
    (card,) = report.gpus
    assert card.name == "NVIDIA L40S"
    assert card.gpu_class == "l40s-45g"
    assert card.memory_mb == 46068
    assert report.driver_version == "535.129.03"
    assert report.cuda_version == "12.2"


def test_a100_sxm4_pair() -> None:
    report = parse_nvidia_smi_xml(machine("a100_sxm4_80g_x2"))
    assert [g.gpu_class for g in report.gpus] == ["a100-80g", "a100-80g"]
    assert [g.pci_bus_id for g in report.gpus] == ["00000000:07:00.0", "00000000:0F:00.0"]


def test_nvidia_smi_xml_with_entities_is_refused() -> None:
    hostile = (
        '<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]>'
        "<nvidia_smi_log><driver_version>&e;</driver_version></nvidia_smi_log>"
    )
    with pytest.raises(ValueError, match="entities"):
        parse_nvidia_smi_xml(hostile)


def test_driver_without_cuda_reports_none_not_na() -> None:
    report = parse_nvidia_smi_xml(
        "<nvidia_smi_log><driver_version>550.54.15</driver_version>"
        "<cuda_version>N/A</cuda_version></nvidia_smi_log>"
    )
    assert report.cuda_version is None
    assert report.gpus == []


def test_epyc_genoa_keeps_avx512_and_bf16_and_drops_noise() -> None:
    cpu = parse_cpuinfo(fixture("proc", "cpuinfo_epyc_avx512.txt"))
    assert cpu.model == "AMD EPYC 9654 96-Core Processor"
    assert cpu.flags == ["avx", "avx2", "avx512f", "avx512_bf16", "fma", "f16c"]
    assert cpu.logical_cpus == 4


def test_old_vm_cpu_model_has_no_avx_at_all() -> None:
    cpu = parse_cpuinfo(machine("cpu_no_avx2", "proc/cpuinfo"))
    assert cpu.model == "QEMU Virtual CPU version 2.5+"
    assert cpu.flags == []
    assert cpu.logical_cpus == 2


def test_graviton3_reports_asimd_and_a_model_from_part_numbers() -> None:
    cpu = parse_cpuinfo(fixture("proc", "cpuinfo_graviton3_arm64.txt"))
    assert cpu.flags == ["asimd"]
    assert cpu.model == "arm implementer 0x41 part 0xd40"


def test_meminfo_total_in_mib() -> None:
    assert parse_meminfo(fixture("proc", "meminfo_epyc_768g.txt")) == 792528452 // 1024
    assert parse_meminfo(machine("cpu_no_avx2", "proc/meminfo")) == 3932
    assert parse_meminfo("") == 0


def test_os_release_pretty_name_or_name_and_version() -> None:
    assert parse_os_release('PRETTY_NAME="Ubuntu 22.04.4 LTS"\nNAME="Ubuntu"\n') == (
        "Ubuntu 22.04.4 LTS"
    )
    assert parse_os_release('NAME="Rocky Linux"\nVERSION_ID="9.3"\n') == "Rocky Linux 9.3"


def test_discover_this_machine_has_cpus_memory_and_no_gpus() -> None:
    inventory = discover_inventory("test-node", "10.0.0.5")
    assert inventory.name == "test-node"
    assert inventory.address == "10.0.0.5"
    assert inventory.cpu_cores > 0
    assert inventory.memory_mb > 0
    assert inventory.arch
    assert inventory.kernel
    if shutil.which("nvidia-smi") is None:
        # No NVIDIA driver here: that is "no GPUs", not an error.
        assert inventory.gpus == []
        assert inventory.nvidia_driver is None
    else:
        assert inventory.gpus
        assert inventory.nvidia_driver


def fake_nvidia_smi(directory: Path, script: str) -> None:
    write_tool(directory / "nvidia-smi", script)


class NoNvml:
    """NVML as on a machine without libnvidia-ml, whatever this test machine has."""

    def read(self) -> NvidiaSmiReport:
        raise GpuToolMissing("no NVML in this test")


def test_discover_runs_nvidia_smi_when_present(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded_nvidia_smi(tmp_path, MACHINES / "h100_sxm_x8")
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    inventory = discover_inventory("gpu-node", "10.0.0.6", nvml=NoNvml())
    assert len(inventory.gpus) == 8
    assert inventory.nvidia_driver == "550.54.15"
    assert inventory.cuda_version == "12.4"
    assert {g.compute_capability for g in inventory.gpus} == {"9.0"}
    assert inventory.nvswitch is True
    assert [g.nearest_nic for g in inventory.gpus] == [f"mlx5_{i}" for i in range(8)]
    assert [g.numa_node for g in inventory.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert inventory.problems == []


def test_nvidia_smi_that_fails_is_a_problem_line_not_a_cpu_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvidia_smi(
        tmp_path,
        'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."\n'
        "exit 9\n",
    )
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    # Registration must still happen: the node says what is wrong instead of dying.
    inventory = discover_inventory("broken-gpu-node", "10.0.0.7", nvml=NoNvml())
    assert inventory.gpus == []
    (problem,) = inventory.problems
    assert problem.startswith("nvidia-smi -q -x exited 9")
    assert "couldn't communicate with the NVIDIA driver" in problem


def test_cpu_node_without_nvidia_smi_has_no_gpus_and_no_problems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it: no nvidia-smi, no ip
    root = MACHINES / "cpu_no_avx2"
    paths = MachinePaths(
        proc=root / "proc",
        etc=root / "etc",
        infiniband=root / "sys/class/infiniband",
        pci_devices=root / "sys/bus/pci/devices",
        imex_channels=root / "dev/nvidia-caps-imex-channels",
    )
    inventory = discover_inventory("vm-1", "10.20.0.7", paths=paths, nvml=NoNvml())
    assert inventory.gpus == []
    assert inventory.problems == []
    assert inventory.nvidia_driver is None
    assert inventory.cpu_model == "QEMU Virtual CPU version 2.5+"
    assert "avx2" not in inventory.cpu_flags
    assert inventory.memory_mb == 3932
    assert inventory.machine_id == "3f9a0c6e2b7d41c58e1f04a7d92b6c31"
    assert inventory.os == "Debian GNU/Linux 12 (bookworm)"
    assert inventory.network_ports == []
    assert inventory.imex is None
    assert inventory.nvswitch is False
