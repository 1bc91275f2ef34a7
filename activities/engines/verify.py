"""Prove an engine binary runs on this machine: ldd finds every library, `--version` exits 0.

A binary can be present and executable yet unable to start for want of one shared library
(libgomp is the classic). ldd names the missing library outright; running `--version` proves
the rest (CPU instructions, loader, permissions).
"""

from __future__ import annotations

import os
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
