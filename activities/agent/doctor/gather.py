"""Read this machine into DoctorFacts. Thin on purpose: every judgement is in the checks, every
parser in parsing.py; this only runs commands and reads files, and never raises for what it
finds (a broken machine is what the doctor is for)."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import subprocess
from pathlib import Path

from activities.agent import procfs
from activities.agent.discovery import discover_inventory
from activities.agent.doctor.facts import (
    MODULES_OF_INTEREST,
    CommandProbe,
    DoctorFacts,
    EngineCheck,
    MemlockLimit,
)
from activities.agent.doctor.parsing import (
    is_agent_command,
    parse_cmdline,
    parse_is_active,
    parse_memlock,
    parse_persistence_csv,
    parse_proc_modules,
)
from engines.adapter import InstallPlace
from engines.engine_dir import version_dirs
from engines.registry import UnknownEngineError, adapter
from workflows.contracts import NodeInventory

COMMAND_TIMEOUT_S = 30.0
OUTPUT_TAIL = 2000
PROC = Path("/proc")
SYS_MODULE = Path("/sys/module")
FABRIC_MANAGER_UNIT = "nvidia-fabricmanager"


def _run(argv: list[str], timeout_s: float = COMMAND_TIMEOUT_S) -> CommandProbe:
    probe = CommandProbe(command=" ".join(argv))
    path = shutil.which(argv[0])
    if path is None:
        return probe
    probe.found = True
    try:
        done = subprocess.run(
            [path, *argv[1:]], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        probe.output = f"did not finish within {timeout_s:.0f}s"
        return probe
    except OSError as err:
        probe.output = str(err)
        return probe
    probe.exit_code = done.returncode
    probe.output = (done.stdout + done.stderr).strip()[-OUTPUT_TAIL:]
    return probe


def _inventory(node: str, address: str) -> NodeInventory:
    # Discovery reports what it finds broken (nvidia-smi present but failing, unreadable XML,
    # `topo -m` failing) as lines in `problems` rather than raising. This only guards against
    # the unforeseen (a parser meeting output nobody recorded): the doctor must still speak
    # about the rest of the machine.
    try:
        return discover_inventory(node, address)
    except Exception as err:  # noqa: BLE001 - the unforeseen, as above: the doctor reports it
        return NodeInventory(name=node, address=address, problems=[f"discovery failed: {err}"])


def _kernel_modules() -> list[str] | None:
    loaded: set[str] | None = None
    with contextlib.suppress(OSError):
        loaded = set(parse_proc_modules((PROC / "modules").read_text()))
    # Built-in modules never appear in /proc/modules (nor does anything on a kernel without
    # module support), but /sys/module has a directory for each.
    if SYS_MODULE.is_dir():
        builtin = {name for name in MODULES_OF_INTEREST if (SYS_MODULE / name).is_dir()}
        loaded = (loaded or set()) | builtin
    if loaded is None:
        return None
    return sorted(name for name in loaded if name in MODULES_OF_INTEREST)


def _agent_pid(node: str) -> int | None:
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = parse_cmdline((entry / "cmdline").read_bytes())
        except OSError:
            continue
        if is_agent_command(argv, node):
            return int(entry.name)
    return None


def _memlock(node: str) -> MemlockLimit:
    pid = _agent_pid(node)
    if pid is not None:
        try:
            limits = parse_memlock((PROC / str(pid) / "limits").read_text())
        except OSError:
            limits = None
        if limits is not None:
            return MemlockLimit(
                soft_bytes=limits[0], hard_bytes=limits[1], source=f"llmgw agent pid {pid}"
            )
    # No agent runs (or its limits are not readable by this user): an agent started from this
    # shell would inherit this process's limit, which is the next best answer.
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return MemlockLimit(
        soft_bytes=None if soft == resource.RLIM_INFINITY else soft,
        hard_bytes=None if hard == resource.RLIM_INFINITY else hard,
        source=f"this shell (no llmgw agent for node {node} runs; one started from here "
        "inherits it)",
    )


def _check_engine(engine: str, version: str, binary: Path, place: InstallPlace) -> EngineCheck:
    """Run the check the agent's liveness watch runs on an installed engine (its adapter's
    reverify: llama-server's --version, a Python engine's entry point and, on an NVIDIA node,
    its CUDA devices)."""
    try:
        engine_adapter = adapter(engine)
    except UnknownEngineError as err:
        return EngineCheck(
            engine=engine, version=version, path=str(binary), runnable=None, detail=str(err)
        )
    verification = engine_adapter.reverify(binary, version, place)
    return EngineCheck(
        engine=engine,
        version=version,
        path=str(binary),
        runnable=verification.ok,
        detail="; ".join((verification.detail, *verification.notes)),
    )


def _engines(state_dir: Path, engine_paths: dict[str, str], nvidia: bool) -> list[EngineCheck]:
    checks: list[EngineCheck] = []
    root = state_dir / "engines"
    # Re-verifying reads no download cache: the place names the state dir's for completeness.
    place = InstallPlace(engines_root=root, cache_dir=state_dir / "cache", nvidia=nvidia)
    for engine, version_dir, marker in version_dirs(root):
        if marker is None:
            checks.append(
                EngineCheck(
                    engine=engine,
                    version=version_dir.name,
                    path=str(version_dir),
                    marker=False,
                    runnable=False,
                    detail="no install marker: the install did not finish or failed",
                )
            )
            continue
        binary = version_dir / marker.binary
        checks.append(_check_engine(marker.engine, marker.version, binary, place))
    for engine, path in sorted(engine_paths.items()):
        binary = Path(path).expanduser()
        checks.append(_check_engine(engine, "operator-provided", binary, place))
    return checks


def _engine_pids(state_dir: Path, node: str) -> list[int]:
    pids: set[int] = set()
    shards = state_dir / "agent" / node / "shards"
    for spec in sorted(shards.glob("*.json")) if shards.is_dir() else []:
        try:
            leader = int(json.loads(spec.read_text())["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        # Engines run in their own process group, led by the pid in the spec; workers they
        # fork (and that hold the GPU) are its members.
        pids.add(leader)
        pids.update(procfs.group_members(leader))
    return sorted(pids)


def _fabric_manager() -> str:
    systemctl = shutil.which("systemctl")
    if systemctl is None:
        return "unknown"
    try:
        done = subprocess.run(
            [systemctl, "is-active", FABRIC_MANAGER_UNIT],
            capture_output=True,
            text=True,
            timeout=10.0,
            check=False,
        )
    except (subprocess.TimeoutExpired, OSError):
        return "unknown"
    # The answer is on stdout; without a running systemd only stderr speaks, and that is unknown.
    return parse_is_active(done.stdout)


def gather_facts(
    state_dir: Path, node: str, address: str, engine_paths: dict[str, str] | None = None
) -> DoctorFacts:
    inventory = _inventory(node, address)
    modules = _kernel_modules()
    nvidia_smi = _run(["nvidia-smi", "-L"])
    persistence: dict[int, bool] = {}
    if nvidia_smi.exit_code == 0:
        query = _run(["nvidia-smi", "--query-gpu=index,persistence_mode", "--format=csv,noheader"])
        if query.exit_code == 0:
            persistence = parse_persistence_csv(query.output)
    nvidia = Path("/proc/driver/nvidia/version").exists() or (
        modules is not None and "nvidia" in modules
    )
    return DoctorFacts(
        inventory=inventory,
        kernel_modules=modules,
        nvidia_driver_loaded=nvidia,
        nvidia_smi=nvidia_smi,
        memlock=_memlock(node),
        fabric_manager=_fabric_manager(),
        persistence_mode=persistence,
        engines=_engines(state_dir, engine_paths or {}, nvidia),
        engine_pids=_engine_pids(state_dir, node),
        state_dir=str(state_dir),
    )
