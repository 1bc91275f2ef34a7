"""`llmgw node bootstrap`'s decisions, without a server or a machine: what it plans on a fresh
machine, that a second run plans nothing, what a change restarts, and what it refuses before
writing anything (workers/commands/node_bootstrap/plan.py, checks.py)."""

import io
from dataclasses import replace
from pathlib import Path

import pytest

from workers.commands.node_bootstrap.checks import (
    agent_flags,
    extra_env,
    service_user,
    token_refusal,
)
from workers.commands.node_bootstrap.command import Refused, read_token
from workers.commands.node_bootstrap.plan import (
    CreateUser,
    Found,
    Machine,
    MakeDir,
    Plan,
    Request,
    Systemctl,
    WriteFile,
    plan,
    touched_paths,
    wanted,
)
from workers.join import JoinToken
from workflows.contracts import NodeInventory, NodeRecord, NodeState, NodeView
from workflows.temporal_security import TemporalSecurity

TOKEN = "llmgw-join-c2VjcmV0LXN0YW5kLWlu"
REQUEST = Request(
    node="gpu-01",
    token=TOKEN,
    namespace="default",
    security=TemporalSecurity(),
    address="10.0.0.11",
    metrics_port=8005,
    user="llmgw",
    llmgw="/opt/llmgw/.venv/bin/llmgw",
    agent_flags=("--label", "pool=batch"),
    extra_env=(),
    config_dir=Path("/etc/llmgw"),
    unit_dir=Path("/etc/systemd/system"),
    state_dir=Path("/var/lib/llmgw"),
    cache_dir=Path("/var/cache/llmgw"),
    service=True,
)
UNIT = Path("/etc/systemd/system/llmgw-agent.service")
ENV = Path("/etc/llmgw/agent.env")
# A fresh machine: /etc/systemd/system exists (root's), nothing of llmgw does.
FRESH = Machine(
    paths={Path("/etc/systemd/system"): Found("dir", 0o40755, "root", "root")},
    sources={},
    user_group=None,
    systemd=True,
)


def after(machine: Machine, done: Plan) -> Machine:
    """The machine once `done` ran, as the executor leaves it."""
    paths = dict(machine.paths)
    user_group = machine.user_group
    enabled, active = machine.enabled, machine.active
    for action in done.actions:
        if isinstance(action, CreateUser):
            user_group = action.name
        elif isinstance(action, MakeDir):
            d = action.target
            paths[d.path] = Found("dir", 0o40000 | d.mode, d.owner, d.group)
        elif isinstance(action, WriteFile):
            f = action.target
            paths[f.path] = Found("file", 0o100000 | f.mode, f.owner, f.group, f.content)
        elif action.args[0] in ("enable", "start", "restart"):
            enabled, active = enabled or action.args[0] == "enable", True
    return replace(machine, paths=paths, user_group=user_group, enabled=enabled, active=active)


def described(done: Plan) -> list[str]:
    return [action.describe() for action in done.actions]


def test_a_fresh_machine_gets_a_user_directories_settings_unit_and_a_started_service() -> None:
    done = plan(REQUEST, FRESH)
    assert described(done) == [
        "create the system user llmgw (home /var/lib/llmgw, no login)",
        "make directory /etc/llmgw (0755 root:root)",
        "make directory /var/lib/llmgw (0700 llmgw:llmgw)",
        "make directory /var/cache/llmgw (0700 llmgw:llmgw)",
        "write /etc/llmgw/agent.env (0600 root:root; holds the join token)",
        "write /etc/systemd/system/llmgw-agent.service (0644 root:root)",
        "systemctl daemon-reload",
        "systemctl enable --now llmgw-agent.service",
    ]
    files = {a.target.path: a.target.content.decode() for a in done.actions
             if isinstance(a, WriteFile)}  # fmt: skip
    assert f"LLMGW_JOIN_TOKEN={TOKEN}\n" in files[ENV]
    for line in ("AGENT_NODE=gpu-01", "AGENT_ADDRESS=10.0.0.11", "LLMGW_STATE_DIR=/var/lib/llmgw"):
        assert line in files[ENV].splitlines()
    # The token is never in the unit, whose command line `systemctl show` prints.
    assert TOKEN not in files[UNIT]
    assert "User=llmgw\n" in files[UNIT]
    assert "EnvironmentFile=-/etc/llmgw/agent.env\n" in files[UNIT]
    assert "--label pool=batch" in files[UNIT]


def test_a_second_run_plans_nothing() -> None:
    first = plan(REQUEST, FRESH)
    second = plan(REQUEST, after(FRESH, first))
    assert second.actions == []
    assert "user llmgw" in second.in_place
    assert "llmgw-agent.service enabled and active" in second.in_place
    assert {str(ENV), str(UNIT), "/var/lib/llmgw"} <= set(second.in_place)


def test_a_changed_setting_rewrites_the_env_file_and_restarts_without_a_reload() -> None:
    running = after(FRESH, plan(REQUEST, FRESH))
    moved = plan(replace(REQUEST, address="10.0.0.12"), running)
    assert described(moved) == [
        "rewrite /etc/llmgw/agent.env (0600 root:root; holds the join token)",
        "systemctl restart llmgw-agent.service",
    ]
    relabelled = plan(replace(REQUEST, agent_flags=("--label", "pool=interactive")), running)
    assert described(relabelled) == [
        "rewrite /etc/systemd/system/llmgw-agent.service (0644 root:root)",
        "systemctl daemon-reload",
        "systemctl restart llmgw-agent.service",
    ]


def test_a_stopped_service_is_started_and_a_loose_env_file_made_private_again() -> None:
    running = after(FRESH, plan(REQUEST, FRESH))
    loose = dict(running.paths)
    loose[ENV] = replace(loose[ENV], mode=0o100644)
    done = plan(REQUEST, replace(running, paths=loose, active=False))
    assert described(done) == [
        "set /etc/llmgw/agent.env to 0600 root:root",
        "systemctl start llmgw-agent.service",
    ]


def test_without_systemd_or_with_no_service_it_writes_and_starts_nothing() -> None:
    for machine, request in ((replace(FRESH, systemd=False), REQUEST),
                             (FRESH, replace(REQUEST, service=False))):  # fmt: skip
        done = plan(request, machine)
        assert not any(isinstance(a, Systemctl) for a in done.actions)
        assert done.changes_files
        assert plan(request, after(machine, done)).actions == []


def test_an_existing_config_dir_is_left_as_the_operator_made_it() -> None:
    machine = replace(FRESH, user_group="llmgw", paths={
        **FRESH.paths, Path("/etc/llmgw"): Found("dir", 0o40750, "root", "llmgw"),
    })  # fmt: skip
    done = plan(REQUEST, machine)
    assert not any(isinstance(a, MakeDir) and a.target.path == Path("/etc/llmgw")
                   for a in done.actions)  # fmt: skip
    assert not any(isinstance(a, CreateUser) for a in done.actions)


def test_something_in_the_way_stops_the_plan() -> None:
    machine = replace(FRESH, paths={**FRESH.paths, Path("/var/lib/llmgw"): Found("file")})
    with pytest.raises(ValueError, match="/var/lib/llmgw is in the way"):
        plan(REQUEST, machine)


def test_tls_files_are_copied_the_keys_private_to_the_service_user() -> None:
    security = TemporalSecurity(
        ca_file=Path("/home/op/ca.pem"), cert_file=Path("/home/op/llmgw.pem"),
        key_file=Path("/home/op/llmgw.key"), server_name="temporal",
    )  # fmt: skip
    sources = {Path("/home/op/ca.pem"): b"CA", Path("/home/op/llmgw.pem"): b"CERT",
               Path("/home/op/llmgw.key"): b"KEY"}  # fmt: skip
    request = replace(REQUEST, security=security)
    done = plan(request, replace(FRESH, sources=sources))
    files = {a.target.path.name: a.target for a in done.actions if isinstance(a, WriteFile)}
    assert (files["ca.pem"].content, files["ca.pem"].mode, files["ca.pem"].owner) == (
        b"CA", 0o644, "root")  # fmt: skip
    assert (files["client.key"].mode, files["client.key"].owner) == (0o600, "llmgw")
    env = files["agent.env"].content.decode().splitlines()
    assert "LLMGW_TEMPORAL_TLS_CA=/etc/llmgw/tls/ca.pem" in env
    assert "LLMGW_TEMPORAL_TLS_KEY=/etc/llmgw/tls/client.key" in env
    assert "LLMGW_TEMPORAL_TLS_SERVER_NAME=temporal" in env
    _, items = wanted(request, replace(FRESH, sources=sources))
    assert {item.path for item in items} <= set(touched_paths(request))


# --- refusals ---------------------------------------------------------------------------------

IDENTITY = "ed25519:" + "ab" * 32


def view(state: NodeState, identity: str = IDENTITY, machine: str = "m-1") -> NodeView:
    inventory = NodeInventory(name="gpu-01", hostname="box-a", machine_id=machine)
    return NodeView(record=NodeRecord(inventory=inventory, state=state), identity=identity)


def test_a_token_the_control_plane_would_refuse_is_refused_with_what_to_do() -> None:
    def refusal(v: NodeView | None, machine: str = "m-1") -> str | None:
        return token_refusal("gpu-01", "10.0.0.2:7233", IDENTITY, v, machine)

    assert "has no node 'gpu-01'" in str(refusal(None))
    assert "llmgw node add gpu-01" in str(refusal(None))
    assert "was removed" in str(refusal(view(NodeState.REMOVED)))
    assert "another token" in str(refusal(view(NodeState.AWAITING, "ed25519:" + "cd" * 32)))
    assert "live on another machine (box-a)" in str(refusal(view(NodeState.READY), "m-2"))
    # Taken: a node still awaiting its first agent, pinned or not; this machine again; a node
    # lost on another machine (a replacement may take its name); a pre-key identity.
    assert refusal(view(NodeState.AWAITING, "")) is None
    assert refusal(view(NodeState.READY)) is None
    assert refusal(view(NodeState.LOST), "m-2") is None
    assert refusal(view(NodeState.READY, "0f" * 32)) is None


def test_the_service_user_and_os_package_consent() -> None:
    assert service_user(None, False) == "llmgw"
    assert service_user(None, True) == "root"
    assert service_user("svc", False) == "svc"
    with pytest.raises(ValueError, match="needs root"):
        service_user("svc", True)


def test_agent_flags_pass_through_and_refuse_what_the_unit_cannot_hold() -> None:
    flags = agent_flags(["pool=a"], {"llamacpp": "/opt/ls"}, "http://ctl:8004", True,
                        "10.0.0.2:7233", ["--heartbeat-every=5"])  # fmt: skip
    assert flags == ("--label", "pool=a", "--engine-path", "llamacpp=/opt/ls",
                     "--mirror", "http://ctl:8004", "--temporal", "10.0.0.2:7233",
                     "--install-os-packages", "--heartbeat-every=5")  # fmt: skip
    with pytest.raises(ValueError, match="only letters"):
        agent_flags(["team=a b"], {}, "", False, None, [])
    with pytest.raises(ValueError, match="KEY=VALUE"):
        agent_flags(["team"], {}, "", False, None, [])
    with pytest.raises(ValueError, match="bootstrap sets that itself"):
        agent_flags([], {}, "", False, None, ["--join=llmgw-join-x"])


def test_extra_environment_cannot_override_what_bootstrap_sets() -> None:
    assert extra_env(["PIP_INDEX_URL=https://mirror/simple", "A=1"]) == (
        ("A", "1"), ("PIP_INDEX_URL", "https://mirror/simple"))  # fmt: skip
    for bad in ("LLMGW_JOIN_TOKEN=x", "LLMGW_TEMPORAL_TLS_CA=/x", "1A=b", "NOEQUALS"):
        with pytest.raises(ValueError, match="--env"):
            extra_env([bad])


def test_the_token_comes_from_the_flag_or_stdin_and_a_bad_one_stops_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    token = JoinToken("gpu-01", "10.0.0.2:7233", b"\x07" * 32)
    assert read_token(token.encode()) == token
    monkeypatch.setattr("sys.stdin", io.StringIO(token.encode() + "\n"))
    assert read_token("-") == token
    with pytest.raises(Refused, match="--join TOKEN is needed"):
        read_token(None)
    with pytest.raises(Refused, match="malformed"):
        read_token("llmgw-join-!!")
