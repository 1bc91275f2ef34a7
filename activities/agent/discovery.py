"""What this machine is: CPU, memory, OS, NVIDIA GPUs and their topology, RDMA ports, the
management interface and IMEX, as a NodeInventory.

The parsers are pure and fed recorded output in tests (gpu_parsing, topology_parsing,
fabric_parsing, imex); `discover_inventory` only gathers the text and calls them. Nothing it
finds wrong raises: a failing step becomes a line in `problems`, so registration still happens
and the operator hears what broke.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path

from activities.agent.fabric_parsing import SYSFS_INFINIBAND, management_interface, read_rdma_ports
from activities.agent.gpu_parsing import NvidiaSmiReport
from activities.agent.imex import CHANNELS_DIR, discover_imex
from activities.agent.nvml_source import (
    GpuSource,
    GpuToolFailed,
    GpuToolMissing,
    NvidiaSmiSource,
    NvmlSource,
    Runner,
    merge_reports,
    needs_fill,
    run_command,
)
from activities.agent.topology_parsing import (
    PCI_DEVICES,
    Topology,
    attach_topology,
    has_nvswitch,
    parse_topo_matrix,
    read_pci_numa_node,
)
from workflows.contracts import GpuInfo, NodeInventory

# Flags that decide which engine build runs fast (or at all) on this CPU. The full list is
# hundreds of words nobody places on.
RELEVANT_CPU_FLAGS = (
    "avx",
    "avx2",
    "avx512f",
    "avx512_bf16",
    "amx_tile",
    "fma",
    "f16c",
    "neon",
    "asimd",
)


@dataclass(frozen=True)
class CpuInfo:
    model: str = ""
    flags: list[str] = field(default_factory=list)
    logical_cpus: int = 0


def parse_meminfo(text: str) -> int:
    """MemTotal in MiB (0 when absent)."""
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key.strip() == "MemTotal":
            parts = rest.split()
            if parts and parts[0].isdigit():
                kib = int(parts[0])
                return kib // 1024
    return 0


def parse_cpuinfo(text: str) -> CpuInfo:
    """Model name, relevant flags and the number of logical CPUs listed.

    x86 says `model name` and `flags`; arm64 says `Features` and often has no model name at
    all, only `CPU implementer`/`CPU part` numbers, which are reported as they are.
    """
    model = ""
    implementer = ""
    part = ""
    seen_flags: set[str] = set()
    processors = 0
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        value = value.strip()
        if key == "processor":
            processors += 1
        elif key in ("model name", "cpu model") and not model:
            model = value
        elif key in ("flags", "features"):
            seen_flags.update(value.split())
        elif key == "cpu implementer" and not implementer:
            implementer = value
        elif key == "cpu part" and not part:
            part = value
    if not model and implementer:
        model = f"arm implementer {implementer} part {part}".strip()
    flags = [f for f in RELEVANT_CPU_FLAGS if f in seen_flags]
    return CpuInfo(model=model, flags=flags, logical_cpus=processors)


def parse_os_release(text: str) -> str:
    """PRETTY_NAME from /etc/os-release, falling back to NAME VERSION_ID."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip('"')
    if "PRETTY_NAME" in values:
        return values["PRETTY_NAME"]
    return " ".join(v for v in (values.get("NAME", ""), values.get("VERSION_ID", "")) if v)


@dataclass(frozen=True)
class MachinePaths:
    """Where discovery reads the machine; tests point these into a fixture tree."""

    proc: Path = Path("/proc")
    etc: Path = Path("/etc")
    infiniband: Path = SYSFS_INFINIBAND
    pci_devices: Path = PCI_DEVICES
    imex_channels: Path = CHANNELS_DIR


def _read(path: Path | str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _usable_cores() -> int:
    # The CPUs this process may run on (a cpuset or taskset narrows them), not the host's count.
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 0


def discover_gpus(smi: GpuSource, nvml: GpuSource | None) -> tuple[NvidiaSmiReport, list[str]]:
    """GPUs from nvidia-smi, filled from NVML where it lacked something; and any problems.

    No nvidia-smi is a CPU node unless NVML alone finds GPUs. An nvidia-smi that fails is a
    problem line, not an exception: the node still registers and says what is wrong.
    """
    empty = NvidiaSmiReport(driver_version=None, cuda_version=None)
    try:
        report: NvidiaSmiReport | None = smi.read()
    except GpuToolMissing:
        report = None
    except GpuToolFailed as err:
        return empty, [str(err)]
    if nvml is None or (report is not None and not needs_fill(report)):
        return report or empty, []
    try:
        fill = nvml.read()
    except (GpuToolMissing, GpuToolFailed):
        return report or empty, []
    return (merge_reports(report, fill) if report is not None else fill), []


def read_topology(run: Runner = run_command, binary: str = "nvidia-smi") -> Topology | str:
    """`nvidia-smi topo -m` parsed, or the reason it could not be read."""
    path = shutil.which(binary)
    if path is None:
        return f"{binary} not found"
    done = run([path, "topo", "-m"])
    if done.returncode != 0:
        return f"nvidia-smi topo -m exited {done.returncode}: {done.stderr.strip()[-300:]}"
    return parse_topo_matrix(done.stdout)


def _with_pci_numa(gpus: list[GpuInfo], root: Path) -> list[GpuInfo]:
    # Where topo -m gave no NUMA node (N/A, or it failed), the kernel's view of the PCI device.
    return [
        g
        if g.numa_node is not None
        else g.model_copy(update={"numa_node": read_pci_numa_node(g.pci_bus_id, root)})
        for g in gpus
    ]


def discover_inventory(
    name: str,
    address: str,
    *,
    paths: MachinePaths | None = None,
    nvml: GpuSource | None = None,
) -> NodeInventory:
    paths = paths or MachinePaths()
    cpu = parse_cpuinfo(_read(paths.proc / "cpuinfo"))
    report, problems = discover_gpus(NvidiaSmiSource(), nvml or NvmlSource())
    gpus = report.gpus
    matrix: list[list[str]] = []
    nvswitch = False
    if gpus:
        topology = read_topology()
        if isinstance(topology, str):
            problems.append(topology)
        else:
            gpus = attach_topology(gpus, topology)
            matrix = topology.matrix
            nvswitch = has_nvswitch(topology)
        gpus = _with_pci_numa(gpus, paths.pci_devices)
    return NodeInventory(
        name=name,
        address=address,
        hostname=socket.gethostname(),
        machine_id=_read(paths.etc / "machine-id").strip(),
        os=parse_os_release(_read(paths.etc / "os-release")) or platform.system(),
        kernel=platform.release(),
        arch=platform.machine(),
        cpu_model=cpu.model or platform.processor(),
        cpu_cores=_usable_cores(),
        cpu_flags=cpu.flags,
        memory_mb=parse_meminfo(_read(paths.proc / "meminfo")),
        nvidia_driver=report.driver_version,
        cuda_version=report.cuda_version,
        gpus=gpus,
        nvlink_matrix=matrix,
        nvswitch=nvswitch,
        network_ports=read_rdma_ports(paths.infiniband),
        management_interface=management_interface(address),
        imex=discover_imex(proc_root=paths.proc, channels_dir=paths.imex_channels),
        problems=problems,
    )
