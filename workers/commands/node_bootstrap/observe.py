"""What `llmgw node bootstrap` reads of this machine before it plans: the paths it may write,
the files it copies, the service user, and whether systemd runs here. Reads only."""

import grp
import pwd
import socket
import stat
import subprocess
from pathlib import Path

from workers.commands.node_bootstrap.plan import MISSING, Found, Machine, Request
from workers.commands.node_bootstrap.unit import UNIT_NAME

# sd_booted(3): systemd is the init of this machine when this directory exists.
SYSTEMD_RUNTIME = Path("/run/systemd/system")
MACHINE_ID = Path("/etc/machine-id")


def found(path: Path) -> Found:
    try:
        info = path.lstat()
    except FileNotFoundError:
        return MISSING
    owner, group = owner_name(info.st_uid), group_name(info.st_gid)
    if stat.S_ISDIR(info.st_mode):
        return Found("dir", info.st_mode, owner, group)
    if stat.S_ISREG(info.st_mode):
        return Found("file", info.st_mode, owner, group, path.read_bytes())
    return Found("other", info.st_mode, owner, group)


def owner_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def user_group(user: str) -> str | None:
    """The user's primary group; None when there is no such user."""
    try:
        return group_name(pwd.getpwnam(user).pw_gid)
    except KeyError:
        return None


def systemctl_says(*args: str) -> str:
    try:
        done = subprocess.run(
            ["systemctl", *args, UNIT_NAME], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip()


def look(req: Request, paths: list[Path]) -> Machine:
    sources: dict[Path, bytes] = {}
    for source in (
        req.security.ca_file,
        req.security.cert_file,
        req.security.key_file,
        req.security.api_key_file,
        req.security.payload_key_file,
    ):
        if source is not None:
            try:
                sources[source] = source.read_bytes()
            except OSError as err:
                raise ValueError(f"cannot read {source}: {err.strerror}") from None
    systemd = SYSTEMD_RUNTIME.is_dir()
    return Machine(
        paths={p: found(p) for p in paths},
        sources=sources,
        user_group=user_group(req.user),
        systemd=systemd,
        enabled=systemd and systemctl_says("is-enabled") == "enabled",
        active=systemd and systemctl_says("is-active") == "active",
    )


def machine_id() -> str:
    try:
        return MACHINE_ID.read_text().strip()
    except OSError:
        return ""


def address_towards(temporal: str) -> str:
    """This machine's address on the route to the control plane: where engines should listen
    for gateways there. A UDP socket's connect sends nothing; it only picks the route."""
    host, _, port = temporal.rpartition(":")
    host = host.strip("[]")
    try:
        family, kind, proto, _, where = socket.getaddrinfo(host, int(port or 7233),
                                                           type=socket.SOCK_DGRAM)[0]  # fmt: skip
        with socket.socket(family, kind, proto) as probe:
            probe.connect(where)
            return str(probe.getsockname()[0])
    except (OSError, ValueError) as err:
        raise ValueError(
            f"cannot tell this machine's address towards {temporal} ({err}): pass --address"
        ) from None
