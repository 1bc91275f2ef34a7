"""nvidia-imex: installed, running, and the IMEX channels a process can open.

Without IMEX, GPUs of one multi-node NVLink domain (GB200 NVL72) cannot map each other's
memory across nodes. Each reader takes a root path so tests feed recorded trees.

"Running" is a process whose /proc/<pid>/comm is nvidia-imex, not `systemctl is-active`: the
agent may run where systemd is not PID 1 (a container sharing the host's PID namespace), and
IMEX may be started by something other than its unit (the GPU operator's driver container).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from workflows.contracts import ImexInfo

IMEX_BINARY = "nvidia-imex"
IMEX_FALLBACK_PATHS = ("/usr/bin/nvidia-imex", "/usr/sbin/nvidia-imex")
CHANNELS_DIR = Path("/dev/nvidia-caps-imex-channels")
PROC = Path("/proc")


def imex_installed(
    which: Callable[[str], str | None] = shutil.which,
    fallback_paths: tuple[str, ...] = IMEX_FALLBACK_PATHS,
) -> str:
    """Where nvidia-imex is ("" when it is not): on PATH, or where the driver package puts
    it, since an agent's unit often has a PATH without /usr/sbin."""
    found = which(IMEX_BINARY)
    if found:
        return found
    return next((p for p in fallback_paths if Path(p).is_file()), "")


def imex_running(proc_root: Path | str = PROC) -> bool:
    root = Path(proc_root)
    if not root.is_dir():
        return False
    for entry in root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() == IMEX_BINARY:
                return True
        except OSError:
            continue  # the process exited while we looked
    return False


def imex_channels(channels_dir: Path | str = CHANNELS_DIR) -> list[int]:
    """N of each /dev/nvidia-caps-imex-channels/channelN, in order."""
    directory = Path(channels_dir)
    if not directory.is_dir():
        return []
    numbers = [
        int(p.name.removeprefix("channel"))
        for p in directory.iterdir()
        if p.name.startswith("channel") and p.name.removeprefix("channel").isdigit()
    ]
    return sorted(numbers)


def read_imex(
    installed: str, running: bool, channels: list[int], channels_dir_exists: bool
) -> ImexInfo | None:
    """None on a machine with no trace of IMEX (most machines); otherwise what is there and,
    in `detail`, what is missing for a multi-node NVLink job."""
    if not installed and not running and not channels_dir_exists:
        return None
    missing = []
    if not installed:
        missing.append("nvidia-imex is not installed")
    elif not running:
        missing.append("nvidia-imex is not running")
    if not channels:
        missing.append(f"no IMEX channel under {CHANNELS_DIR}")
    return ImexInfo(
        installed=bool(installed),
        running=running,
        channels=channels,
        detail="; ".join(missing) or f"running from {installed or IMEX_BINARY}",
    )


def discover_imex(
    proc_root: Path | str = PROC,
    channels_dir: Path | str = CHANNELS_DIR,
    which: Callable[[str], str | None] = shutil.which,
    fallback_paths: tuple[str, ...] = IMEX_FALLBACK_PATHS,
) -> ImexInfo | None:
    return read_imex(
        installed=imex_installed(which, fallback_paths),
        running=imex_running(proc_root),
        channels=imex_channels(channels_dir),
        channels_dir_exists=Path(channels_dir).is_dir(),
    )
