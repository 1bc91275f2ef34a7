"""A peer proxy's own virtual environment (LiteLLM's, the vLLM router's): built on first use
under ~/.cache/llmgw/bench, then reused. Peers are never llmgw's dependencies (not in
pyproject): only this benchmark runs them, each with its own packages. A marker file says the
install finished, so an interrupted one is redone rather than trusted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from bench.gateway.procs import Child, http_get, wait_until

CACHE_DIR = Path.home() / ".cache" / "llmgw" / "bench"
INSTALLED_MARKER = ".installed"
INSTALL_TIMEOUT_S = 1800.0


class Unavailable(RuntimeError):
    """The arm cannot run here; the message says why."""


def executable_or_reason(asked: bool, install: Callable[[], Path]) -> Path | str:
    """A peer's executable from `install` (installing it on first use), or why there is none;
    call it before the benchmark pins itself to a core, as a first install may use them all."""
    if not asked:
        return "not asked for"
    try:
        return install()
    except Unavailable as exc:
        return str(exc)


def executable(found: Path | str) -> Path:
    """What executable_or_reason found: the executable, or Unavailable with its reason."""
    if isinstance(found, str):
        raise Unavailable(found)
    return found


def ensure_installed(venv: Path, requirement: str, executable: str, label: str) -> Path:
    """`executable` from `venv`, installing `requirement` there first if it is not yet (the
    first time: a few minutes, the output in <name>-install.log beside the environment).
    Unavailable, saying why, when the install fails."""
    exe = venv / "bin" / executable
    if (venv / INSTALLED_MARKER).exists() and exe.exists():
        return exe
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    log_file = venv.parent / f"{venv.name.removesuffix('-venv')}-install.log"
    print(f"installing {requirement} into {venv} (once; a few minutes)", file=sys.stderr)
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [
            str(venv / "bin" / "pip"),
            "install",
            "--quiet",
            "--disable-pip-version-check",
            requirement,
        ],
    ]
    with log_file.open("wb") as log:
        for step in steps:
            try:
                done = subprocess.run(
                    step, stdout=log, stderr=subprocess.STDOUT, timeout=INSTALL_TIMEOUT_S
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise Unavailable(f"installing {label} failed: {exc}") from exc
            if done.returncode != 0:
                tail = log_file.read_text(errors="replace").splitlines()[-5:]
                raise Unavailable(
                    f"installing {label} failed ({' '.join(step[:3])} exited "
                    f"{done.returncode}; {log_file}): " + " / ".join(tail)
                )
    if not exe.exists():
        raise Unavailable(f"the install finished but {exe} is missing")
    (venv / INSTALLED_MARKER).touch()
    return exe


def version(venv: Path, distribution: str, **env: str) -> str:
    """The installed version of `distribution` in `venv`, "?" where it cannot be read."""
    python = venv / "bin" / "python"
    code = f"import importlib.metadata as m; print(m.version({distribution!r}))"
    try:
        out = subprocess.run(
            [str(python), "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **env},
        )
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return out.stdout.strip() or "?"


def serving(child: Child, port: int, health_path: str, timeout_s: float, poll_s: float) -> Child:
    """A peer's process once its health path answers 200; stopped if it never does (or the
    wait is interrupted)."""
    try:
        wait_until(child, lambda: http_get(port, health_path)[0] == 200, timeout_s, poll_s)
    except BaseException:
        child.stop()
        raise
    return child
