"""An engine's log file on its node (activities/agent/supervisor.py): opened for each start with
a mark (rotated once when it has grown too big), its tail, and the one redacted line on why the
latest run failed. The log stays on the node: engine output can hold prompts.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from activities.agent.exit_reason import error_line

LOG_TAIL_BYTES = 4096
# How far back a failure's cause is looked for: a vLLM start that fails prints its root cause
# and then tens of KB of the tracebacks it caused.
CAUSE_SEARCH_BYTES = 256 * 1024
_START_MARK = "=== llmgw "
# An engine's log is rotated once at (re)start when it has grown past this.
LOG_ROTATE_BYTES = 16 * 1024 * 1024


def open_log(path: Path, command: list[str]) -> int:
    try:
        if path.stat().st_size > LOG_ROTATE_BYTES:
            os.replace(path, path.with_suffix(".log.1"))
    except FileNotFoundError:
        pass
    # 0600: engine output can include prompts.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    os.write(fd, f"{_START_MARK}{stamp}: starting {command[0]} ===\n".encode())
    return fd


def log_tail(path: Path, max_bytes: int = LOG_TAIL_BYTES) -> str:
    try:
        with path.open("rb") as log:
            log.seek(0, os.SEEK_END)
            size = log.tell()
            log.seek(max(0, size - max_bytes))
            return log.read().decode(errors="replace")
    except OSError:
        return ""


def failure_line(path: Path) -> str:
    """One redacted line on why the engine's latest run failed (exit_reason.error_line),
    looked for only in what that run wrote: the log keeps earlier runs above it."""
    tail = log_tail(path, CAUSE_SEARCH_BYTES)
    return error_line(tail[max(0, tail.rfind(_START_MARK)) :])
