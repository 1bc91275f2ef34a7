"""Record what discovery and the doctor read on this machine as a machine fixture, in the layout
of tests/fixtures/machines (its README): the tools' output in files named after the command,
and the few /proc, /etc, /sys and /dev files they read, at their paths under the fixture.

Beside them: `recorded.json`, how the recording was made (the address discovery was given,
every command's exit status), and `discovery.json`, what discovery makes of the recording (the
fields a fixture can reproduce), written by the check once it compared that with what discovery
found live (`steady_view`: the two readings are seconds apart, so memory in use, GPU processes
and port counters may differ). A test loads each recorded fixture the way the other
machine tests do and holds its discovery to `discovery.json`
(tests/unit/test_gpu_check_fixtures.py).

The machine ID is replaced by a digest of it: a fixture is committed, the ID is the host's.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from activities.agent.discovery import MachinePaths
from activities.agent.imex import IMEX_BINARY
from activities.agent.nvml_source import CommandResult, Runner, run_command
from workflows.contracts import NodeInventory

DISCOVERY_FILE = "discovery.json"
META_FILE = "recorded.json"


@dataclass(frozen=True)
class Command:
    """A command discovery or the doctor runs, and the fixture file its output goes to."""

    file: str
    argv: tuple[str, ...]
    # Its answer is on stdout whatever the exit status (systemctl is-active exits 3 for
    # "inactive"); the others are recorded only when they succeed, as the fixtures hold them.
    answer_on_failure: bool = False


COMMANDS = (
    Command("nvidia_smi_q_x.xml", ("nvidia-smi", "-q", "-x")),
    Command("nvidia_smi_L.txt", ("nvidia-smi", "-L")),
    Command(
        "nvidia_smi_compute_cap.csv",
        ("nvidia-smi", "--query-gpu=index,compute_cap", "--format=csv,noheader"),
    ),
    Command("nvidia_smi_topo_m.txt", ("nvidia-smi", "topo", "-m")),
    Command("ip_o_4_addr.txt", ("ip", "-o", "-4", "addr", "show")),
    # The doctor's own reads, beside discovery's.
    Command(
        "nvidia_smi_persistence.csv",
        ("nvidia-smi", "--query-gpu=index,persistence_mode", "--format=csv,noheader"),
    ),
    Command(
        "systemctl_is_active_nvidia_fabricmanager.txt",
        ("systemctl", "is-active", "nvidia-fabricmanager"),
        answer_on_failure=True,
    ),
)
# Files read under /proc and /etc (the doctor's /proc/modules and the driver's version too).
PROC_FILES = ("cpuinfo", "meminfo", "modules", "driver/nvidia/version")
ETC_FILES = ("os-release", "machine-id")
# What discovery reads of each RDMA port (fabric_parsing.read_rdma_ports).
PORT_FILES = ("link_layer", "state", "phys_state", "rate", "lid")
PORT_DIRS = ("gids", "gid_attrs/types", "gid_attrs/ndevs", "counters")
# Discovery's view that a fixture cannot reproduce: the host it runs on, the CPUs this process
# may use, and what the agent adds beside discovery.
HOST_FIELDS = frozenset(
    {
        "name",
        "hostname",
        "kernel",
        "arch",
        "cpu_cores",
        "artifacts",
        "artifact_disk_free_mb",
        "metrics_url",
    }
)


@dataclass(frozen=True)
class MachineSources:
    """Where the recorder reads the machine: the real paths, or a fixture tree in tests."""

    paths: MachinePaths = field(default_factory=MachinePaths)
    which: Callable[[str], str | None] = shutil.which
    run: Runner = run_command


def anonymous_machine_id(machine_id: str) -> str:
    """A stable stand-in for the host's machine ID, of the same shape (32 hex digits)."""
    if not machine_id.strip():
        return ""
    return hashlib.sha256(b"llmgw-fixture:" + machine_id.strip().encode()).hexdigest()[:32]


def fixture_view(inventory: NodeInventory) -> dict[str, Any]:
    """The inventory as a fixture reproduces it, as JSON: every field but HOST_FIELDS, and
    IMEX's detail, which names where nvidia-imex was found (a fake's path, on a fixture)."""
    exclude: dict[str, Any] = dict.fromkeys(HOST_FIELDS, True)
    exclude["imex"] = {"detail": True}
    return inventory.model_dump(mode="json", exclude=exclude)


def steady_view(inventory: NodeInventory) -> dict[str, Any]:
    """fixture_view without what changes between two readings a few seconds apart: each GPU's
    memory in use and processes, each RDMA port's counters."""
    view = fixture_view(inventory)
    for gpu in view["gpus"]:
        gpu.pop("memory_used_mb", None)
        gpu.pop("processes", None)
    for port in view["network_ports"]:
        port.pop("counters", None)
    return view


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None  # absent, or unreadable (sysfs answers EINVAL for unpopulated GIDs)


def _copy_text(source: Path, dest: Path) -> bool:
    text = _read(source)
    if text is None:
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text)
    return True


def _record_commands(dest: Path, sources: MachineSources) -> list[dict[str, Any]]:
    ran: list[dict[str, Any]] = []
    for command in COMMANDS:
        binary = sources.which(command.argv[0])
        if binary is None:
            ran.append({"command": " ".join(command.argv), "found": False})
            continue
        done: CommandResult = sources.run([binary, *command.argv[1:]])
        kept = done.returncode == 0 or command.answer_on_failure
        if kept:
            (dest / command.file).write_text(done.stdout)
        ran.append(
            {
                "command": " ".join(command.argv),
                "file": command.file if kept else None,
                "found": True,
                "exit_code": done.returncode,
                "stderr": done.stderr.strip()[-500:],
            }
        )
    return ran


def _record_proc_etc(dest: Path, paths: MachinePaths) -> None:
    for name in PROC_FILES:
        _copy_text(paths.proc / name, dest / "proc" / name)
    for name in ETC_FILES:
        text = _read(paths.etc / name)
        if text is None:
            continue
        if name == "machine-id":
            text = anonymous_machine_id(text) + "\n"
        (dest / "etc").mkdir(parents=True, exist_ok=True)
        (dest / "etc" / name).write_text(text)


def _record_imex(dest: Path, paths: MachinePaths) -> None:
    """The nvidia-imex processes' comm (all discovery looks for in /proc) and the channels."""
    if paths.proc.is_dir():
        for entry in paths.proc.iterdir():
            if entry.name.isdigit() and (_read(entry / "comm") or "").strip() == IMEX_BINARY:
                _copy_text(entry / "comm", dest / "proc" / entry.name / "comm")
    channels = paths.imex_channels
    if channels.is_dir():
        target = dest / "dev" / channels.name
        target.mkdir(parents=True, exist_ok=True)
        for entry in channels.iterdir():
            if entry.name.startswith("channel"):
                (target / entry.name).touch()  # a device node on the host: its name is the fact


def _record_rdma(dest: Path, root: Path) -> None:
    if not root.is_dir():
        return
    target_root = dest / "sys" / "class" / "infiniband"
    for device in sorted(root.iterdir()):
        target = target_root / device.name
        net = device / "device" / "net"
        if net.is_dir():
            for netdev in net.iterdir():
                _copy_text(netdev / "ifindex", target / "device" / "net" / netdev.name / "ifindex")
        ports = device / "ports"
        if not ports.is_dir():
            continue
        for port in ports.iterdir():
            if not port.name.isdigit():
                continue
            out = target / "ports" / port.name
            for name in PORT_FILES:
                _copy_text(port / name, out / name)
            for sub in PORT_DIRS:
                if (port / sub).is_dir():
                    for entry in (port / sub).iterdir():
                        _copy_text(entry, out / sub / entry.name)


def _record_pci_numa(dest: Path, inventory: NodeInventory, root: Path) -> None:
    """Each GPU's PCI device's numa_node (read where `topo -m` gave none)."""
    for gpu in inventory.gpus:
        domain, sep, rest = gpu.pci_bus_id.partition(":")
        if not sep:
            continue
        name = f"{domain[-4:]}:{rest}".lower()
        _copy_text(
            root / name / "numa_node", dest / "sys" / "bus" / "pci" / "devices" / name / "numa_node"
        )


def record_machine(
    dest: Path,
    inventory: NodeInventory,
    sources: MachineSources,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write the fixture of the machine `inventory` was discovered on into `dest` (which must
    not exist: a recording is never merged into another). `extra` goes into recorded.json;
    discovery.json is written after (write_expected)."""
    if dest.exists():
        raise FileExistsError(f"{dest} exists: choose another --name, or remove it first")
    dest.mkdir(parents=True)
    commands = _record_commands(dest, sources)
    _record_proc_etc(dest, sources.paths)
    _record_imex(dest, sources.paths)
    _record_rdma(dest, sources.paths.infiniband)
    _record_pci_numa(dest, inventory, sources.paths.pci_devices)
    meta = {
        "recorded_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "address": inventory.address,
        "arch": inventory.arch,
        "nvidia_imex_installed": inventory.imex is not None and inventory.imex.installed,
        "commands": commands,
        **(extra or {}),
    }
    (dest / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return dest


def write_expected(root: Path, inventory: NodeInventory) -> None:
    """discovery.json: what discovery makes of the recording at `root`, which the fixture
    tests hold it to."""
    (root / DISCOVERY_FILE).write_text(json.dumps(fixture_view(inventory), indent=2) + "\n")


def read_meta(root: Path) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((root / META_FILE).read_text())
    return found


def read_expected(root: Path) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((root / DISCOVERY_FILE).read_text())
    return found
