"""Discovery run on a recorded machine fixture, as the machine tests run it: the tools it calls
(nvidia-smi, ip, nvidia-imex) are small scripts answering from the recording, first and alone
on PATH, and MachinePaths point into the fixture's /proc, /etc, /sys and /dev trees. NVML is
absent, as in the tests.

The GPU check loads the fixture it just recorded this way and compares the result with what
discovery found live: a fixture that misses a file discovery read shows up at once, on the
machine, not later in a test. tests/unit/test_gpu_check_fixtures.py holds this loader and the
tests' own (tests/machine_tools.py) to the same answer on every machine fixture.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from activities.agent.discovery import MachinePaths, discover_inventory
from activities.agent.gpu_parsing import NvidiaSmiReport
from activities.agent.nvml_source import GpuToolMissing
from bench.gpu_check.recorder import COMMANDS, read_meta
from workflows.contracts import NodeInventory


class NoNvml:
    """NVML as on a machine without libnvidia-ml: a fixture records nvidia-smi, not NVML."""

    def read(self) -> NvidiaSmiReport:
        raise GpuToolMissing("a machine fixture has no NVML")


def fixture_paths(root: Path) -> MachinePaths:
    return MachinePaths(
        proc=root / "proc",
        etc=root / "etc",
        infiniband=root / "sys/class/infiniband",
        pci_devices=root / "sys/bus/pci/devices",
        imex_channels=root / "dev/nvidia-caps-imex-channels",
    )


def _write_tool(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def tool_scripts(root: Path, imex: bool) -> dict[str, str]:
    """Each tool the recording holds answers for, as a shell script's body: the recorded file
    for the arguments it was recorded with, exit 9 for any others."""
    cat = shutil.which("cat") or "/bin/cat"
    cases: dict[str, list[str]] = {}
    for command in COMMANDS:
        recorded = root / command.file
        if recorded.is_file():
            args = " ".join(command.argv[1:])
            cases.setdefault(command.argv[0], []).append(
                f"  {shlex.quote(args)}) exec {cat} {shlex.quote(str(recorded))} ;;\n"
            )
    scripts = {
        tool: 'case "$*" in\n' + "".join(lines) + "  *) exit 9 ;;\nesac\n"
        for tool, lines in cases.items()
    }
    if imex:
        scripts["nvidia-imex"] = "exit 0\n"
    return scripts


@contextlib.contextmanager
def tools_alone_on_path(scripts: dict[str, str]) -> Iterator[None]:
    """PATH holding only these scripts while the block runs (discovery runs in this process:
    steps run one at a time, so nothing else reads PATH meanwhile)."""
    saved = os.environ.get("PATH")
    with tempfile.TemporaryDirectory(prefix="llmgw-fixture-tools-") as tmp:
        for name, body in scripts.items():
            _write_tool(Path(tmp) / name, body)
        os.environ["PATH"] = tmp
        try:
            yield
        finally:
            if saved is None:
                os.environ.pop("PATH", None)
            else:
                os.environ["PATH"] = saved


def discover_fixture(root: Path, node: str) -> NodeInventory:
    """What discovery makes of the machine recorded at `root` (with recorded.json), given the
    address the recording was made with."""
    meta = read_meta(root)
    scripts = tool_scripts(root, bool(meta.get("nvidia_imex_installed")))
    with tools_alone_on_path(scripts):
        return discover_inventory(
            node, str(meta["address"]), paths=fixture_paths(root), nvml=NoNvml()
        )


def differences(expected: dict[str, object], found: dict[str, object]) -> list[str]:
    """The top-level fields that differ, each as `field: expected != found` (cut short)."""
    lines = []
    for name in sorted(set(expected) | set(found)):
        if expected.get(name) != found.get(name):
            lines.append(f"{name}: {str(expected.get(name))[:120]} != {str(found.get(name))[:120]}")
    return lines
