"""Finding processes by a token on their command line, for tests of engine processes."""

from pathlib import Path

from activities.agent import procfs


def pids_with_token(token: str) -> list[int]:
    """Live (not zombie) processes whose command line holds `token`, sorted."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        stat = procfs.read_stat(int(entry.name))
        if token.encode() in cmdline and stat is not None and stat.running:
            found.append(int(entry.name))
    return sorted(found)
