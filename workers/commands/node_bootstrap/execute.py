"""Carrying out a bootstrap plan: each action as it says, stopping at the first that fails.

A file is written whole or not at all: its content goes to a temporary file beside it, created
with the final mode (so a secret is never readable by others, not even briefly), owned as it
should be, then renamed over the old one."""

import grp
import os
import pwd
import subprocess
import tempfile

from workers.commands.node_bootstrap.plan import (
    Action,
    CreateUser,
    File,
    MakeDir,
    Systemctl,
    WriteFile,
)

COMMAND_TIMEOUT_S = 120


class ActionFailed(Exception):
    pass


def ids(owner: str, group: str) -> tuple[int, int]:
    """Looked up when the action runs: the service user may have been made a step before."""
    try:
        uid = int(owner) if owner.isdigit() else pwd.getpwnam(owner).pw_uid
        gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    except KeyError:
        raise ActionFailed(f"no such user or group: {owner}:{group}") from None
    return uid, gid


def write_file(target: File) -> None:
    uid, gid = ids(target.owner, target.group)
    fd, temporary = tempfile.mkstemp(prefix=f".{target.path.name}.", dir=target.path.parent)
    try:
        os.fchmod(fd, target.mode)
        os.fchown(fd, uid, gid)
        with os.fdopen(fd, "wb") as out:
            out.write(target.content)
        os.replace(temporary, target.path)
    except BaseException:
        os.unlink(temporary)
        raise


def run(argv: list[str]) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ActionFailed(f"{' '.join(argv)}: {err}") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()
        raise ActionFailed(f"{' '.join(argv)} exited {done.returncode}: {said}")


def execute(action: Action) -> None:
    try:
        if isinstance(action, CreateUser | Systemctl):
            run(action.argv)
        elif isinstance(action, MakeDir):
            target = action.target
            target.path.mkdir(mode=target.mode, parents=True, exist_ok=True)
            os.chown(target.path, *ids(target.owner, target.group))
            os.chmod(target.path, target.mode)  # mkdir's mode goes through the umask
        elif isinstance(action, WriteFile):
            write_file(action.target)
    except OSError as err:
        raise ActionFailed(f"{action.describe()}: {err}") from None
