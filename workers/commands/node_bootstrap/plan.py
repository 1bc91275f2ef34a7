"""What `llmgw node bootstrap` does to this machine, decided from what was asked and what is
there. Pure: `plan` takes the request and the machine as found and returns the actions still
needed, so a second run with the same request finds everything in place and plans nothing.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from workers.commands.node_bootstrap.unit import (
    AGENT_ENV_NAME,
    UNIT_NAME,
    UnitSettings,
    render_env_file,
    render_unit,
)
from workflows.temporal_security import TemporalSecurity

ROOT = "root"


@dataclass(frozen=True)
class Request:
    """What the operator asked for, its flags already checked (workers/commands/node_bootstrap/
    inputs.py)."""

    node: str
    token: str  # the join token, encoded
    namespace: str
    security: TemporalSecurity  # as given: the files are copied under config_dir/tls
    address: str
    metrics_port: int
    user: str
    llmgw: str  # the executable the unit runs
    agent_flags: tuple[str, ...]  # besides node, address and metrics
    extra_env: tuple[tuple[str, str], ...]
    config_dir: Path
    unit_dir: Path
    state_dir: Path
    cache_dir: Path
    service: bool  # False: --no-service, write the files and start nothing

    @property
    def unit_path(self) -> Path:
        return self.unit_dir / UNIT_NAME

    @property
    def env_path(self) -> Path:
        return self.config_dir / AGENT_ENV_NAME


@dataclass(frozen=True)
class Found:
    """A path as this machine has it now."""

    kind: Literal["missing", "dir", "file", "other"]
    mode: int = 0
    owner: str = ""
    group: str = ""
    content: bytes = b""


MISSING = Found("missing")


@dataclass(frozen=True)
class Machine:
    paths: dict[Path, Found]  # every path the plan may write
    sources: dict[Path, bytes]  # the TLS and key files to copy, as read
    user_group: str | None  # the service user's primary group; None: no such user yet
    systemd: bool  # systemd runs this machine (/run/systemd/system exists)
    enabled: bool = False
    active: bool = False


@dataclass(frozen=True)
class Dir:
    path: Path
    mode: int
    owner: str
    group: str
    # False: a directory that may well exist already (/etc/llmgw): made if missing, left as is.
    enforce: bool = True


@dataclass(frozen=True)
class File:
    path: Path
    content: bytes
    mode: int
    owner: str
    group: str
    holds: str = ""  # the secret it holds, said instead of its content


@dataclass(frozen=True)
class CreateUser:
    name: str
    home: Path

    @property
    def argv(self) -> list[str]:
        return ["useradd", "--system", "--user-group", "--home-dir", str(self.home),
                "--no-create-home", "--shell", "/usr/sbin/nologin", self.name]  # fmt: skip

    def describe(self) -> str:
        return f"create the system user {self.name} (home {self.home}, no login)"


@dataclass(frozen=True)
class MakeDir:
    target: Dir
    exists: bool

    def describe(self) -> str:
        t = self.target
        verb = "set" if self.exists else "make"
        return f"{verb} directory {t.path} ({t.mode:04o} {t.owner}:{t.group})"


@dataclass(frozen=True)
class WriteFile:
    target: File
    exists: bool
    same_content: bool  # only its mode or owner are wrong

    def describe(self) -> str:
        t = self.target
        mode = f"{t.mode:04o} {t.owner}:{t.group}"
        if self.same_content:
            return f"set {t.path} to {mode}"
        holds = f"; holds {t.holds}" if t.holds else ""
        return f"{'rewrite' if self.exists else 'write'} {t.path} ({mode}{holds})"


@dataclass(frozen=True)
class Systemctl:
    args: tuple[str, ...]

    @property
    def argv(self) -> list[str]:
        return ["systemctl", *self.args]

    def describe(self) -> str:
        return " ".join(self.argv)


Action = CreateUser | MakeDir | WriteFile | Systemctl


@dataclass(frozen=True)
class Plan:
    actions: list[Action]
    unit: UnitSettings
    in_place: list[str] = field(default_factory=list)  # what needed nothing, in words

    @property
    def changes_files(self) -> bool:
        return any(not isinstance(a, Systemctl) for a in self.actions)


# Where each TLS or key file the connection names is copied to, under config_dir/tls, and
# whether it is a secret (readable by the service user alone).
TLS_COPIES = {
    "ca_file": ("ca.pem", "LLMGW_TEMPORAL_TLS_CA", ""),
    "cert_file": ("client.pem", "LLMGW_TEMPORAL_TLS_CERT", ""),
    "key_file": ("client.key", "LLMGW_TEMPORAL_TLS_KEY", "the client certificate's key"),
    "api_key_file": ("api-key", "LLMGW_TEMPORAL_API_KEY_FILE", "the Temporal API key"),
    "payload_key_file": ("payload.key", "LLMGW_PAYLOAD_KEY_FILE", "the payload keys"),
}


def unit_settings(req: Request, group: str) -> UnitSettings:
    return UnitSettings(
        llmgw=req.llmgw,
        user=req.user,
        group=group,
        config_dir=str(req.config_dir),
        agent_flags=req.agent_flags,
        node=req.node,
    )


Variables = list[tuple[str, str]]


def tls_files(req: Request, machine: Machine, group: str) -> tuple[list[File], Variables]:
    """The copies of the connection's files, and the variables that name them."""
    files: list[File] = []
    env: Variables = []
    if req.security.tls:
        env.append(("LLMGW_TEMPORAL_TLS", "1"))
    if req.security.server_name:
        env.append(("LLMGW_TEMPORAL_TLS_SERVER_NAME", req.security.server_name))
    for attribute, (name, variable, holds) in TLS_COPIES.items():
        source: Path | None = getattr(req.security, attribute)
        if source is None:
            continue
        copy = req.config_dir / "tls" / name
        owner, owner_group = (req.user, group) if holds else (ROOT, ROOT)
        files.append(File(copy, machine.sources[source], 0o600 if holds else 0o644,
                          owner, owner_group, holds))  # fmt: skip
        env.append((variable, str(copy)))
    return files, env


def env_values(req: Request, tls_env: Variables) -> Variables:
    return [
        ("AGENT_NODE", req.node),
        ("AGENT_ADDRESS", req.address),
        ("AGENT_METRICS_PORT", str(req.metrics_port)),
        ("LLMGW_STATE_DIR", str(req.state_dir)),
        ("LLMGW_CACHE_DIR", str(req.cache_dir)),
        ("LLMGW_TEMPORAL_NAMESPACE", req.namespace),
        *tls_env,
        *req.extra_env,
        ("LLMGW_JOIN_TOKEN", req.token),
    ]


def touched_paths(req: Request) -> list[Path]:
    """Every path `wanted` may name, known before the machine is read."""
    tls = req.config_dir / "tls"
    given = [name for attr, (name, _, _) in TLS_COPIES.items() if getattr(req.security, attr)]
    copies = [tls / name for name in given]
    dirs = [req.config_dir, req.state_dir, req.cache_dir, tls, req.unit_dir]
    return [*dirs, *copies, req.env_path, req.unit_path]


def wanted(req: Request, machine: Machine) -> tuple[UnitSettings, list[Dir | File]]:
    """Everything that must be in place, in the order it is put there."""
    group = machine.user_group or req.user  # useradd --user-group names it after the user
    unit = unit_settings(req, group)
    copies, tls_env = tls_files(req, machine, group)
    env_text = render_env_file(req.node, env_values(req, tls_env))
    items: list[Dir | File] = [
        Dir(req.config_dir, 0o755, ROOT, ROOT, enforce=False),
        Dir(req.state_dir, 0o700, req.user, group),
        Dir(req.cache_dir, 0o700, req.user, group),
    ]
    if copies:
        items.append(Dir(req.config_dir / "tls", 0o755, ROOT, ROOT))
        items += copies
    items += [
        File(req.env_path, env_text.encode(), 0o600, ROOT, ROOT, "the join token"),
        Dir(req.unit_dir, 0o755, ROOT, ROOT, enforce=False),
        File(req.unit_path, render_unit(unit).encode(), 0o644, ROOT, ROOT),
    ]
    return unit, items


def step(item: Dir | File, found: Found) -> MakeDir | WriteFile | None:
    """The action that puts `item` in place, or None when it is."""
    owned = (found.mode & 0o7777, found.owner, found.group) == (item.mode, item.owner, item.group)
    if isinstance(item, Dir):
        if found.kind == "dir" and (owned or not item.enforce):
            return None
        if found.kind not in ("missing", "dir"):
            raise ValueError(f"{item.path} is in the way: it should be a directory")
        return MakeDir(item, exists=found.kind == "dir")
    if found.kind == "file" and found.content == item.content and owned:
        return None
    if found.kind not in ("missing", "file"):
        raise ValueError(f"{item.path} is in the way: it should be a file")
    same = found.kind == "file" and found.content == item.content
    return WriteFile(item, exists=found.kind == "file", same_content=same)


def service_steps(req: Request, machine: Machine, actions: list[Action]) -> list[Systemctl]:
    if not (req.service and machine.systemd):
        return []
    unit_changed = any(isinstance(a, WriteFile) and a.target.path == req.unit_path for a in actions)
    config_changed = any(isinstance(a, WriteFile | CreateUser) for a in actions)
    steps = [Systemctl(("daemon-reload",))] if unit_changed else []
    if not machine.enabled:
        steps.append(Systemctl(("enable", "--now", UNIT_NAME)))
    elif not machine.active:
        steps.append(Systemctl(("start", UNIT_NAME)))
    if machine.active and config_changed:
        steps.append(Systemctl(("restart", UNIT_NAME)))
    return steps


def plan(req: Request, machine: Machine) -> Plan:
    """Raises ValueError when something in the way (a file where a directory goes) stops it."""
    actions: list[Action] = []
    in_place: list[str] = []
    if machine.user_group is None:
        actions.append(CreateUser(req.user, req.state_dir))
    else:
        in_place.append(f"user {req.user}")
    unit, items = wanted(req, machine)
    for item in items:
        action = step(item, machine.paths.get(item.path, MISSING))
        if action is None:
            in_place.append(str(item.path))
        else:
            actions.append(action)
    service = service_steps(req, machine, actions)
    actions += service
    if req.service and machine.systemd and not service:
        in_place.append(f"{UNIT_NAME} enabled and active")
    return Plan(actions, unit, in_place)
