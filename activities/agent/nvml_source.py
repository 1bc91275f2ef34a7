"""Where GPU facts come from: nvidia-smi's text, or NVML through pynvml, behind one Protocol.

Discovery prefers nvidia-smi (its XML has ECC, fabric and processes per MIG instance in one
call) and asks NVML only for what the text lacked. Both are read through injectable seams (a
command runner, a pynvml-shaped module) so tests run them on recorded output and a fake.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from activities.agent.gpu_parsing import (
    NO_INSTANCES_CARVED,
    NvidiaSmiReport,
    gpu_class,
    mig_class,
    mig_index,
    parse_compute_caps,
    parse_nvidia_smi_list,
    parse_nvidia_smi_xml,
)
from workflows.contracts import GpuInfo, GpuProcess, MigInstance

NVIDIA_SMI_TIMEOUT_S = 30.0
_MIB = 1024 * 1024


class GpuToolMissing(Exception):
    """No NVIDIA tooling here (no nvidia-smi, no libnvidia-ml): a CPU node, not an error."""


class GpuToolFailed(Exception):
    """The tooling is here but failed (driver not loaded, timeout): a problem to report."""


class GpuSource(Protocol):
    def read(self) -> NvidiaSmiReport:
        """Every GPU placement can use; raises GpuToolMissing or GpuToolFailed."""
        ...


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str = ""


Runner = Callable[[Sequence[str]], CommandResult]


def run_command(argv: Sequence[str], timeout_s: float = NVIDIA_SMI_TIMEOUT_S) -> CommandResult:
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return CommandResult(124, "", f"did not finish within {timeout_s:.0f}s")
    except OSError as err:
        return CommandResult(127, "", str(err))
    return CommandResult(done.returncode, done.stdout, done.stderr)


class NvidiaSmiSource:
    """GPUs from `nvidia-smi -q -x`, with `-L` for MIG UUIDs and profiles and the compute_cap
    query for compute capability. Only `-q -x` must succeed; the others only add detail."""

    def __init__(
        self,
        binary: str = "nvidia-smi",
        run: Runner = run_command,
        which: Callable[[str], str | None] = shutil.which,
    ) -> None:
        self._binary = binary
        self._run = run
        self._which = which

    def read(self) -> NvidiaSmiReport:
        path = self._which(self._binary)
        if path is None:
            raise GpuToolMissing(f"{self._binary} not found")
        xml = self._run([path, "-q", "-x"])
        if xml.returncode != 0:
            reason = (xml.stderr or xml.stdout).strip()[-500:]
            raise GpuToolFailed(f"nvidia-smi -q -x exited {xml.returncode}: {reason}")
        listed = self._run([path, "-L"])
        caps = self._run([path, "--query-gpu=index,compute_cap", "--format=csv,noheader"])
        try:
            return parse_nvidia_smi_xml(
                xml.stdout,
                listed=parse_nvidia_smi_list(listed.stdout) if listed.returncode == 0 else None,
                compute_caps=parse_compute_caps(caps.stdout) if caps.returncode == 0 else None,
            )
        except (ValueError, SyntaxError) as err:  # ET.ParseError is a SyntaxError
            raise GpuToolFailed(f"nvidia-smi -q -x gave unreadable XML: {err}") from err


def _str(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _cuda_version(number: int) -> str:
    # NVML says 12040 for CUDA 12.4.
    return f"{number // 1000}.{(number % 1000) // 10}"


class NvmlSource:
    """GPUs through NVML. `nvml` is the pynvml module (package nvidia-ml-py) or anything with
    its functions: tests pass a small fake, never a GPU."""

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = nvml

    def _module(self) -> Any:
        if self._nvml is not None:
            return self._nvml
        try:
            import pynvml
        except ImportError as err:
            raise GpuToolMissing("pynvml (nvidia-ml-py) is not installed") from err
        return pynvml

    def read(self) -> NvidiaSmiReport:
        nvml = self._module()
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as err:
            # No libnvidia-ml or no driver: nothing NVML can say, which nvidia-smi (if it is
            # here) reports in its own words.
            raise GpuToolMissing(f"NVML unavailable: {err}") from err
        try:
            return self._read(nvml)
        except nvml.NVMLError as err:
            raise GpuToolFailed(f"NVML failed: {err}") from err
        finally:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()

    def _read(self, nvml: Any) -> NvidiaSmiReport:
        gpus: list[GpuInfo] = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            card = self._device(nvml, handle, index)
            instances = self._mig_instances(nvml, handle, card)
            gpus.extend(instances or [card])
        return NvidiaSmiReport(
            driver_version=_str(nvml.nvmlSystemGetDriverVersion()),
            cuda_version=_cuda_version(int(nvml.nvmlSystemGetCudaDriverVersion())),
            gpus=gpus,
        )

    def _processes(self, nvml: Any, handle: Any) -> list[GpuProcess]:
        try:
            running = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except nvml.NVMLError:
            return []
        return [
            GpuProcess(pid=int(p.pid), used_memory_mb=int(p.usedGpuMemory or 0) // _MIB)
            for p in running
        ]

    def _ecc(self, nvml: Any, handle: Any) -> int:
        try:
            return int(
                nvml.nvmlDeviceGetTotalEccErrors(
                    handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
                )
            )
        except nvml.NVMLError:
            return 0  # ECC not supported (GeForce, most workstation boards)

    def _device(self, nvml: Any, handle: Any, index: int) -> GpuInfo:
        name = _str(nvml.nvmlDeviceGetName(handle))
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        ecc = self._ecc(nvml, handle)
        return GpuInfo(
            index=index,
            uuid=_str(nvml.nvmlDeviceGetUUID(handle)),
            name=name,
            gpu_class=gpu_class(name, int(memory.total) // _MIB),
            memory_mb=int(memory.total) // _MIB,
            memory_used_mb=int(memory.used) // _MIB,
            pci_bus_id=_str(nvml.nvmlDeviceGetPciInfo(handle).busId),
            compute_capability=f"{major}.{minor}",
            processes=self._processes(nvml, handle),
            ecc_uncorrected=ecc,
            unusable=f"{ecc} uncorrected ECC errors since the driver loaded" if ecc else "",
        )

    def _mig_instances(self, nvml: Any, handle: Any, card: GpuInfo) -> list[GpuInfo]:
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        except nvml.NVMLError:
            return []  # a card without MIG
        if current != nvml.NVML_DEVICE_MIG_ENABLE:
            return []
        instances: list[GpuInfo] = []
        for device in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, device)
            except nvml.NVMLError:
                continue  # an empty slot: instances need not be numbered densely
            # NVML names an instance "<card name> MIG 3g.40gb".
            profile = _str(nvml.nvmlDeviceGetName(mig)).rpartition("MIG ")[2] or "unknown"
            memory = nvml.nvmlDeviceGetMemoryInfo(mig)
            instances.append(
                GpuInfo(
                    index=mig_index(card.index, device),
                    uuid=_str(nvml.nvmlDeviceGetUUID(mig)),
                    name=f"{card.name} MIG {profile}",
                    gpu_class=mig_class(card.gpu_class, profile),
                    memory_mb=int(memory.total) // _MIB,
                    memory_used_mb=int(memory.used) // _MIB,
                    pci_bus_id=card.pci_bus_id,
                    compute_capability=card.compute_capability,
                    processes=self._processes(nvml, mig),
                    ecc_uncorrected=card.ecc_uncorrected,
                    mig=MigInstance(
                        parent_index=card.index,
                        parent_uuid=card.uuid,
                        profile=profile,
                        gpu_instance_id=int(nvml.nvmlDeviceGetGpuInstanceId(mig)),
                        compute_instance_id=int(nvml.nvmlDeviceGetComputeInstanceId(mig)),
                    ),
                    unusable=card.unusable,
                )
            )
        if not instances:
            return [card.model_copy(update={"unusable": card.unusable or NO_INSTANCES_CARVED})]
        return instances


def merge_reports(primary: NvidiaSmiReport, fill: NvidiaSmiReport) -> NvidiaSmiReport:
    """`primary` (nvidia-smi) with what it lacked taken from `fill` (NVML): compute capability
    and MIG UUIDs and profiles, matched by index (cards and instances share the numbering)."""
    by_index = {g.index: g for g in fill.gpus}
    merged: list[GpuInfo] = []
    for gpu in primary.gpus:
        other = by_index.get(gpu.index)
        if other is None:
            merged.append(gpu)
            continue
        update: dict[str, object] = {}
        if not gpu.compute_capability and other.compute_capability:
            update["compute_capability"] = other.compute_capability
        if gpu.mig is not None and not gpu.uuid and other.uuid:
            update["uuid"] = other.uuid
            if gpu.unusable.startswith("MIG instance UUID unknown"):
                update["unusable"] = ""
            if gpu.mig.profile == "unknown" and other.mig is not None:
                update["mig"] = gpu.mig.model_copy(update={"profile": other.mig.profile})
                update["gpu_class"] = other.gpu_class
                update["name"] = other.name
        merged.append(gpu.model_copy(update=update) if update else gpu)
    return NvidiaSmiReport(
        driver_version=primary.driver_version or fill.driver_version,
        cuda_version=primary.cuda_version or fill.cuda_version,
        gpus=merged,
        cards=primary.cards,
    )


def needs_fill(report: NvidiaSmiReport) -> bool:
    return any(not g.compute_capability or not g.uuid for g in report.gpus)
