"""NVML behind GpuSource: a fake of the pynvml module API, never a GPU."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from activities.agent.discovery import discover_gpus
from activities.agent.gpu_parsing import NO_INSTANCES_CARVED, NvidiaSmiReport, parse_nvidia_smi_xml
from activities.agent.nvml_source import (
    CommandResult,
    GpuToolFailed,
    GpuToolMissing,
    NvidiaSmiSource,
    NvmlSource,
    merge_reports,
)

MACHINES = Path(__file__).resolve().parent.parent / "fixtures" / "machines"
GIB = 1024**3


class NVMLError(Exception):
    pass


@dataclass
class Memory:
    total: int
    used: int
    free: int = 0


@dataclass
class Process:
    pid: int
    usedGpuMemory: int | None


@dataclass
class Pci:
    busId: str


@dataclass
class Device:
    name: str
    uuid: str
    memory: Memory
    bus: str = ""
    cc: tuple[int, int] = (8, 0)
    mig_mode: tuple[int, int] | None = None  # None: the card has no MIG
    migs: dict[int, "Device"] = field(default_factory=dict)
    max_migs: int = 7
    processes: list[Process] = field(default_factory=list)
    gi: int = 0
    ci: int = 0
    ecc: int = 0


class FakeNvml:
    """The slice of pynvml's module API that NvmlSource calls."""

    NVMLError = NVMLError
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0

    def __init__(self, devices: list[Device], init_error: str = "") -> None:
        self.devices = devices
        self.init_error = init_error
        self.shut_down = False

    def nvmlInit(self) -> None:
        if self.init_error:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return "535.183.01"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12020

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Device:
        return self.devices[index]

    def nvmlDeviceGetName(self, d: Device) -> str:
        return d.name

    def nvmlDeviceGetUUID(self, d: Device) -> bytes:
        return d.uuid.encode()  # older bindings return bytes

    def nvmlDeviceGetMemoryInfo(self, d: Device) -> Memory:
        return d.memory

    def nvmlDeviceGetPciInfo(self, d: Device) -> Pci:
        return Pci(busId=d.bus)

    def nvmlDeviceGetCudaComputeCapability(self, d: Device) -> tuple[int, int]:
        return d.cc

    def nvmlDeviceGetComputeRunningProcesses(self, d: Device) -> list[Process]:
        return d.processes

    def nvmlDeviceGetTotalEccErrors(self, d: Device, kind: int, counter: int) -> int:
        return d.ecc

    def nvmlDeviceGetMigMode(self, d: Device) -> tuple[int, int]:
        if d.mig_mode is None:
            raise NVMLError("Not Supported")
        return d.mig_mode

    def nvmlDeviceGetMaxMigDeviceCount(self, d: Device) -> int:
        return d.max_migs

    def nvmlDeviceGetMigDeviceHandleByIndex(self, d: Device, index: int) -> Device:
        if index not in d.migs:
            raise NVMLError("Not Found")
        return d.migs[index]

    def nvmlDeviceGetGpuInstanceId(self, d: Device) -> int:
        return d.gi

    def nvmlDeviceGetComputeInstanceId(self, d: Device) -> int:
        return d.ci


def a100_mig_machine() -> FakeNvml:
    card0 = Device(
        name="NVIDIA A100-SXM4-80GB",
        uuid="GPU-0cb1e29c-658c-da14-95e6-0af593bd04cf",
        memory=Memory(total=81920 * 1024**2, used=0),
        bus="00000000:07:00.0",
        mig_mode=(1, 1),
        migs={
            0: Device(
                name="NVIDIA A100-SXM4-80GB MIG 3g.40gb",
                uuid="MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f",
                memory=Memory(total=40192 * 1024**2, used=11891 * 1024**2),
                processes=[Process(pid=220417, usedGpuMemory=11878 * 1024**2)],
                gi=1,
            ),
            1: Device(
                name="NVIDIA A100-SXM4-80GB MIG 3g.40gb",
                uuid="MIG-4bd4a1a0-2b08-5c8e-9a54-1e0f9a6b33d7",
                memory=Memory(total=40192 * 1024**2, used=13 * 1024**2),
                gi=2,
            ),
        },
    )
    card1 = Device(
        name="NVIDIA A100-SXM4-80GB",
        uuid="GPU-8e81973e-0bec-d7b0-3898-d190f9ebdacc",
        memory=Memory(total=81920 * 1024**2, used=0),
        mig_mode=(1, 1),
    )
    return FakeNvml([card0, card1])


def test_nvml_reports_mig_instances_like_nvidia_smi() -> None:
    nvml = a100_mig_machine()
    report = NvmlSource(nvml).read()
    first, second, uncarved = report.gpus
    assert [first.index, second.index, uncarved.index] == [1000, 1001, 1]
    assert first.uuid == "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f"
    assert first.gpu_class == "a100-80g-mig-3g.40gb"
    assert first.memory_mb == 40192
    assert first.compute_capability == "8.0"
    assert first.mig is not None
    assert first.mig.gpu_instance_id == 1
    assert [(p.pid, p.used_memory_mb) for p in first.processes] == [(220417, 11878)]
    assert uncarved.unusable == NO_INSTANCES_CARVED
    assert report.driver_version == "535.183.01"
    assert report.cuda_version == "12.2"
    assert nvml.shut_down


def test_nvml_whole_card_with_ecc_errors() -> None:
    nvml = FakeNvml(
        [
            Device(
                name="NVIDIA H100 80GB HBM3",
                uuid="GPU-a",
                memory=Memory(81559 * 1024**2, 0),
                cc=(9, 0),
                ecc=3,
            )
        ]
    )
    (card,) = NvmlSource(nvml).read().gpus
    assert (card.index, card.gpu_class, card.compute_capability) == (0, "h100-80g", "9.0")
    assert card.unusable.startswith("3 uncorrected ECC errors")


def test_nvml_without_library_is_missing_not_failed() -> None:
    with pytest.raises(GpuToolMissing):
        NvmlSource(FakeNvml([], init_error="NVML Shared Library Not Found")).read()


def test_nvidia_smi_mig_without_L_is_filled_from_nvml() -> None:
    xml = (MACHINES / "a100_80g_mig_3g40gb" / "nvidia_smi_q_x.xml").read_text()
    bare = parse_nvidia_smi_xml(xml)  # no -L: instances without UUIDs, no compute capability
    merged = merge_reports(bare, NvmlSource(a100_mig_machine()).read())
    first, _second, uncarved = merged.gpus
    assert first.uuid == "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f"
    assert first.gpu_class == "a100-80g-mig-3g.40gb"
    assert first.unusable == ""
    assert first.compute_capability == "8.0"
    assert uncarved.unusable == NO_INSTANCES_CARVED


def smi_runner(machine: str, fail: bool = False) -> Any:
    root = MACHINES / machine
    answers = {
        "-q -x": "nvidia_smi_q_x.xml",
        "-L": "nvidia_smi_L.txt",
        "--query-gpu=index,compute_cap --format=csv,noheader": "nvidia_smi_compute_cap.csv",
    }

    def run(argv: list[str]) -> CommandResult:
        if fail:
            return CommandResult(9, "NVIDIA-SMI has failed because it couldn't communicate")
        return CommandResult(0, (root / answers[" ".join(argv[1:])]).read_text())

    return run


def test_nvidia_smi_source_reads_all_three_commands() -> None:
    source = NvidiaSmiSource(run=smi_runner("a100_80g_mig_3g40gb"), which=lambda b: f"/usr/bin/{b}")
    report = source.read()
    assert [g.uuid[:4] for g in report.gpus] == ["MIG-", "MIG-", "GPU-"]


def test_discover_gpus_prefers_nvidia_smi_and_reports_failure_as_a_problem() -> None:
    missing = NvidiaSmiSource(which=lambda _: None)
    failing = NvidiaSmiSource(run=smi_runner("h200_x1", fail=True), which=lambda b: f"/x/{b}")
    empty_nvml = NvmlSource(FakeNvml([], init_error="Driver Not Loaded"))

    report, problems = discover_gpus(missing, empty_nvml)
    assert (report.gpus, problems) == ([], [])

    report, problems = discover_gpus(failing, empty_nvml)
    assert report.gpus == []
    assert problems[0].startswith("nvidia-smi -q -x exited 9")

    # nvidia-smi absent but NVML present (a container with only the library): NVML's GPUs.
    report, problems = discover_gpus(missing, NvmlSource(a100_mig_machine()))
    assert len(report.gpus) == 3
    assert problems == []


def test_failing_source_raises_the_failure_type() -> None:
    failing = NvidiaSmiSource(run=smi_runner("h200_x1", fail=True), which=lambda b: f"/x/{b}")
    with pytest.raises(GpuToolFailed, match="exited 9"):
        failing.read()


def test_complete_nvidia_smi_report_does_not_ask_nvml() -> None:
    class Exploding:
        def read(self) -> NvidiaSmiReport:
            raise AssertionError("NVML asked although nvidia-smi said everything")

    source = NvidiaSmiSource(run=smi_runner("h200_x1"), which=lambda b: f"/x/{b}")
    report, problems = discover_gpus(source, Exploding())
    assert [g.gpu_class for g in report.gpus] == ["h200-140g"]
    assert report.gpus[0].compute_capability == "9.0"
    assert problems == []
