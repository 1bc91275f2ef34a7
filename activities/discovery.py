"""What this machine is: CPU, memory, OS and NVIDIA GPUs, as a NodeInventory.

The parsers are pure and fed recorded output in tests; `discover_inventory` only gathers the
text and calls them.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from activities.gpu_parsing import NvidiaSmiReport, parse_nvidia_smi_xml
from workflows.contracts import NodeInventory

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
NVIDIA_SMI_TIMEOUT_S = 30.0


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


def _read(path: str) -> str:
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


def query_nvidia_smi(binary: str = "nvidia-smi") -> NvidiaSmiReport:
    """GPUs from nvidia-smi; a machine without the binary simply has no NVIDIA GPUs.

    A binary that exists but fails (driver not loaded, timeout) raises: that node has GPUs it
    cannot use, which an operator must hear about rather than see as a CPU node.
    """
    path = shutil.which(binary)
    if path is None:
        return NvidiaSmiReport(driver_version=None, cuda_version=None)
    done = subprocess.run(
        [path, "-q", "-x"],
        capture_output=True,
        text=True,
        timeout=NVIDIA_SMI_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        reason = (done.stderr or done.stdout).strip()[-500:]
        raise RuntimeError(f"nvidia-smi -q -x exited {done.returncode}: {reason}")
    return parse_nvidia_smi_xml(done.stdout)


def discover_inventory(name: str, address: str) -> NodeInventory:
    cpu = parse_cpuinfo(_read("/proc/cpuinfo"))
    gpus = query_nvidia_smi()
    return NodeInventory(
        name=name,
        address=address,
        hostname=socket.gethostname(),
        os=parse_os_release(_read("/etc/os-release")) or platform.system(),
        kernel=platform.release(),
        arch=platform.machine(),
        cpu_model=cpu.model or platform.processor(),
        cpu_cores=_usable_cores(),
        cpu_flags=cpu.flags,
        memory_mb=parse_meminfo(_read("/proc/meminfo")),
        nvidia_driver=gpus.driver_version,
        cuda_version=gpus.cuda_version,
        gpus=gpus.gpus,
    )
