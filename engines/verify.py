"""Prove an engine binary runs on this machine: ldd finds every library, `--version` exits 0.

A binary can be present and executable yet unable to start for want of one shared library
(libgomp is the classic). ldd names the missing library outright; running `--version` proves
the rest (CPU instructions, loader, permissions).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

VERSION_TIMEOUT_S = 60.0
LDD_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Verification:
    ok: bool
    # The binary's version line when ok, the reason otherwise.
    detail: str
    notes: tuple[str, ...] = ()


def missing_libraries(ldd_output: str) -> list[str]:
    """Library names ldd reports as `libfoo.so.1 => not found`."""
    missing: list[str] = []
    for line in ldd_output.splitlines():
        name, arrow, where = line.strip().partition("=>")
        if arrow and where.strip() == "not found":
            missing.append(name.strip())
    return missing


def version_line(output: str) -> str:
    """The line that names the version; llama-server prints `version: N (commit)` on stderr,
    possibly after backend-loading chatter."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in lines:
        if line.lower().startswith("version"):
            return line
    for line in lines:
        if "version" in line.lower():
            return line
    return lines[0] if lines else ""


def _tail(text: str, limit: int = 600) -> str:
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def check_libraries(binary: Path) -> tuple[list[str], str | None]:
    """(missing libraries, note). The note says why ldd told us nothing, when it did not."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return [], "ldd skipped: ldd is not installed"
    done = subprocess.run(
        [ldd, str(binary)], capture_output=True, text=True, timeout=LDD_TIMEOUT_S, check=False
    )
    output = done.stdout + done.stderr
    if "not a dynamic executable" in output:
        return [], "ldd skipped: not a dynamic executable"
    return missing_libraries(output), None


def verify_binary(binary: Path, env: dict[str, str] | None = None) -> Verification:
    """Run the checks; never raises for a binary that is broken, only says why."""
    if not binary.is_file():
        return Verification(False, f"{binary} does not exist")
    if not os.access(binary, os.X_OK):
        return Verification(False, f"{binary} is not executable")
    missing, note = check_libraries(binary)
    notes = (note,) if note else ()
    if missing:
        return Verification(
            False, f"{binary.name} cannot start: missing libraries {', '.join(missing)}", notes
        )
    try:
        done = subprocess.run(
            [str(binary), "--version"],
            capture_output=True,
            text=True,
            timeout=VERSION_TIMEOUT_S,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return Verification(
            False, f"{binary.name} --version did not exit within {VERSION_TIMEOUT_S:.0f}s", notes
        )
    except OSError as err:
        return Verification(False, f"{binary.name} --version could not run: {err}", notes)
    if done.returncode != 0:
        output = _tail(done.stderr + done.stdout)
        return Verification(
            False, f"{binary.name} --version exited {done.returncode}: {output}", notes
        )
    # llama-server prints its version to stderr; other engines use stdout.
    line = version_line(done.stderr) or version_line(done.stdout)
    return Verification(True, line or f"{binary.name} --version exited 0", notes)


# --- CUDA builds of llama.cpp ------------------------------------------------------------

# `llama-server --list-devices` (common/arg.cpp) prints "Available devices:" then one line per
# non-CPU device: "  CUDA0: NVIDIA H100 80GB HBM3 (81079 MiB, 80500 MiB free)", or "  (none)".
_DEVICE = re.compile(r"^\s*([A-Za-z]+\d+):\s*(.*?)\s*\((\d+) MiB, (\d+) MiB free\)\s*$")
_CUDA_LIBRARIES = ("libggml-cuda", "libcudart", "libcublas")


@dataclass(frozen=True)
class Device:
    name: str  # "CUDA0"
    description: str
    total_mib: int
    free_mib: int


def parse_devices(output: str) -> list[Device]:
    devices = []
    for line in output.splitlines():
        match = _DEVICE.match(line)
        if match:
            name, description, total, free = match.groups()
            devices.append(Device(name, description, int(total), int(free)))
    return devices


def is_cuda_build(binary: Path) -> bool:
    """A CUDA build carries libggml-cuda beside it (GGML_BACKEND_DL) or links the CUDA
    runtime: either way ldd or the directory shows it."""
    if any(binary.parent.glob("libggml-cuda*")):
        return True
    ldd = shutil.which("ldd")
    if ldd is None:
        return False
    done = subprocess.run(
        [ldd, str(binary)], capture_output=True, text=True, timeout=LDD_TIMEOUT_S, check=False
    )
    return any(lib in done.stdout for lib in _CUDA_LIBRARIES)


def check_cuda_devices(binary: Path, env: dict[str, str] | None = None) -> Verification:
    """A CUDA build must list a CUDA device: one whose backend cannot load (a driver or
    runtime mismatch) runs on the CPU without an error, ten times slower and looking fine."""
    try:
        done = subprocess.run(
            [str(binary), "--list-devices"],
            capture_output=True,
            text=True,
            timeout=VERSION_TIMEOUT_S,
            env=env,
            check=False,
        )
    except (subprocess.TimeoutExpired, OSError) as err:
        return Verification(False, f"{binary.name} --list-devices failed: {err}")
    devices = [d for d in parse_devices(done.stdout) if d.name.startswith("CUDA")]
    if done.returncode != 0 or not devices:
        seen = _tail(done.stdout + done.stderr, 300)
        return Verification(
            False,
            f"CUDA build of {binary.name} lists no CUDA device (it would run on the CPU): {seen}",
        )
    listed = ", ".join(f"{d.name} {d.description} ({d.total_mib} MiB)" for d in devices)
    return Verification(True, listed)


def verify_llamacpp(binary: Path, env: dict[str, str] | None = None) -> Verification:
    """verify_binary, and for a CUDA build its devices too (noted beside the version)."""
    check = verify_binary(binary, env)
    if not check.ok or not is_cuda_build(binary):
        return check
    devices = check_cuda_devices(binary, env)
    if not devices.ok:
        return Verification(False, devices.detail, check.notes)
    return Verification(True, check.detail, (*check.notes, f"devices: {devices.detail}"))
