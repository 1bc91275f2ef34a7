"""Pure parsers for the text the doctor reads off a machine; tested on recorded text."""

from __future__ import annotations

from pathlib import PurePath

UNLIMITED = "unlimited"


def parse_proc_modules(text: str) -> list[str]:
    """Module names from /proc/modules ("nvidia_peermem 16384 0 - Live 0x0000000000000000")."""
    names = []
    for line in text.splitlines():
        fields = line.split()
        if fields:
            names.append(fields[0])
    return names


def _limit_value(word: str) -> int | None:
    return None if word == UNLIMITED else int(word)


def parse_memlock(limits_text: str) -> tuple[int | None, int | None] | None:
    """(soft, hard) "Max locked memory" in bytes from /proc/<pid>/limits, None for unlimited;
    None overall when the line is missing or unreadable."""
    for line in limits_text.splitlines():
        if not line.startswith("Max locked memory"):
            continue
        fields = line[len("Max locked memory") :].split()
        if len(fields) < 2:
            return None
        try:
            return _limit_value(fields[0]), _limit_value(fields[1])
        except ValueError:
            return None
    return None


def parse_cmdline(raw: bytes) -> list[str]:
    """/proc/<pid>/cmdline: arguments separated (and ended) by NUL bytes."""
    return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]


def is_agent_command(argv: list[str], node: str) -> bool:
    """True when argv runs `llmgw agent` for `node` (or names no node, taking the default).

    The program is `llmgw` itself or a Python running `workers.cli`, and the word right after
    it is `agent` (llmgw's options all follow the subcommand).
    """
    for i, arg in enumerate(argv):
        if PurePath(arg).name == "llmgw" or arg == "workers.cli":
            rest = argv[i + 1 :]
            break
    else:
        return False
    if not rest or rest[0] != "agent":
        return False
    for i, arg in enumerate(rest):
        if arg == "--node" and i + 1 < len(rest):
            return rest[i + 1] == node
        if arg.startswith("--node="):
            return arg.partition("=")[2] == node
    return True


def parse_is_active(stdout: str) -> str:
    """`systemctl is-active UNIT` prints one word ("active", "inactive", "failed", ...) and
    exits non-zero for all but active, so the word is the answer, not the exit status."""
    for line in stdout.splitlines():
        if line.strip():
            return line.strip()
    return "unknown"


def parse_persistence_csv(text: str) -> dict[int, bool]:
    """`nvidia-smi --query-gpu=index,persistence_mode --format=csv,noheader`: "0, Enabled"."""
    modes: dict[int, bool] = {}
    for line in text.splitlines():
        index, sep, mode = line.partition(",")
        if not sep or not index.strip().isdigit():
            continue
        modes[int(index.strip())] = mode.strip().lower() == "enabled"
    return modes
