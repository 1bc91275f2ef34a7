"""The agent's systemd unit and its environment file, as text. Pure.

One template makes both deploy/systemd/llmgw-agent.service (the example a person copies, rendered
with DEPLOY_EXAMPLE) and the unit `llmgw node bootstrap` writes on a node, so the two cannot
drift: tests/unit/test_node_bootstrap_unit.py holds the file in deploy/ to this module's
rendering. After changing the template, write the example again with
`python -m workers.commands.node_bootstrap.unit > deploy/systemd/llmgw-agent.service`.

Nothing secret ever stands in the unit: the join token is in the environment file (0600), which
the agent reads as $LLMGW_JOIN_TOKEN, so it is not on a command line `ps` or `systemctl show`
would print.
"""

import re
from dataclasses import dataclass

UNIT_NAME = "llmgw-agent.service"
# The settings `llmgw node bootstrap` owns; the shared llmgw.env (deploy/llmgw.env.example) is
# read first, so a value bootstrap writes wins over one an operator set there.
AGENT_ENV_NAME = "agent.env"
SHARED_ENV_NAME = "llmgw.env"
# What a word in ExecStart, or a value in the environment file, may hold without quoting. The
# same text must mean the same to systemd and to sh (the start command printed where there is no
# systemd), so anything else is quoted or refused rather than escaped two ways.
PLAIN = re.compile(r"[A-Za-z0-9_./:=,@+-]+")

DEPLOY_HEADER = """\
# The llmgw node agent: one per machine that runs engines. It registers the node, builds or
# verifies llama-server, and starts, watches and stops the engine processes.
#
# `llmgw node bootstrap --join TOKEN` writes this unit (with this machine's paths), its
# settings in /etc/llmgw/agent.env and the state directory, then enables and starts it
# (docs/nodes.md, "Bootstrap a node"). To set it up by hand instead: run `llmgw node add NAME`
# where the cluster's store is and put the token it prints in /etc/llmgw/agent.env as
# LLMGW_JOIN_TOKEN (with AGENT_NODE=NAME), mode 0600: the agent keeps the node's secret in
# $LLMGW_STATE_DIR/agent/NAME/node.secret and takes the Temporal address from the token.
#
# Generated from workers/commands/node_bootstrap/unit.py: change the template there, not here.
# EXAMPLE PATHS: the checkout and its .venv in /opt/llmgw, settings in /etc/llmgw.
"""

BOOTSTRAP_HEADER = """\
# The llmgw node agent of node {node}, written by `llmgw node bootstrap`: running it again
# rewrites this file. Its settings, the join token among them, are in {agent_env} (0600).
# See docs/nodes.md, "Bootstrap a node".
"""

BODY = """\

[Unit]
Description=llmgw node agent
After=network-online.target llmgw-temporal.service
Wants=network-online.target

[Service]
Type=simple
User={user}
Group={group}
# AGENT_NODE must be the exact name the node secret was derived for (default: the host
# name as systemd sees it; set it explicitly). AGENT_ADDRESS is where engines listen and what
# gateways connect to.
Environment=LLMGW_STATE_DIR=%S/llmgw LLMGW_CACHE_DIR=%C/llmgw
Environment=AGENT_NODE=%H AGENT_ADDRESS=127.0.0.1
# The agent's /metrics (GPU telemetry, its engines' load; no authentication) on the node's
# address, where Prometheus's llmgw-agents job and `llmgw nodes` read it.
Environment=AGENT_METRICS_PORT=8005
# The Temporal address, namespace and TLS or API-key files (LLMGW_TEMPORAL_*) and the join
# token come from these files, the later winning; llmgw reads the files at start, so restart
# after replacing one.
EnvironmentFile=-{shared_env}
EnvironmentFile=-{agent_env}
StateDirectory=llmgw
StateDirectoryMode=0700
# The llama.cpp build, reused by every later install on this machine.
CacheDirectory=llmgw
UMask=0077
ExecStart={exec_start}

# Engines run in their own sessions so that they outlive the agent. systemd's default
# KillMode=control-group would still kill them on every stop or restart of this unit, because
# they stay in its cgroup. KillMode=process sends the signal to the agent alone. The engines
# keep serving, and the next agent adopts them from their spec files (and stops any that no
# running workflow owns). So `systemctl stop llmgw-agent` leaves engines running: to stop them,
# scale or remove their models. systemd logs "left-over process" on the next start; that is
# expected.
KillMode=process
# Engines inherit the agent's limits. llama-server's --mlock (`llmgw model add --arg --mlock`)
# locks the whole model in RAM and fails under the default memlock limit.
LimitMEMLOCK=infinity
Restart=on-failure
RestartSec=5
NoNewPrivileges=yes

[Install]
WantedBy=multi-user.target
"""

# The agent's command line: every value from the environment, so that the unit holds no secret
# and the environment file says everything that differs between nodes.
AGENT_WORDS = (
    "agent",
    "--node",
    "${AGENT_NODE}",
    "--address",
    "${AGENT_ADDRESS}",
    "--metrics-host",
    "${AGENT_ADDRESS}",
    "--metrics-port",
    "${AGENT_METRICS_PORT}",
)


@dataclass(frozen=True)
class UnitSettings:
    llmgw: str  # the `llmgw` executable
    user: str
    group: str
    config_dir: str
    # Agent flags beyond AGENT_WORDS (`--label k=v`, `--engine-path e=p`, ...), each word PLAIN.
    agent_flags: tuple[str, ...] = ()
    node: str = ""  # for the bootstrap header; "" renders the deploy example's

    @property
    def agent_env(self) -> str:
        return f"{self.config_dir}/{AGENT_ENV_NAME}"

    @property
    def shared_env(self) -> str:
        return f"{self.config_dir}/{SHARED_ENV_NAME}"


DEPLOY_EXAMPLE = UnitSettings(
    llmgw="/opt/llmgw/.venv/bin/llmgw", user="llmgw", group="llmgw", config_dir="/etc/llmgw"
)


def command_words(settings: UnitSettings) -> list[str]:
    return [settings.llmgw, *AGENT_WORDS, *settings.agent_flags]


def exec_start(words: list[str]) -> str:
    """The words as ExecStart's value, four words to a line after the first six."""
    lines = [" ".join(words[:6])]
    for i in range(6, len(words), 4):
        lines.append("    " + " ".join(words[i : i + 4]))
    return " \\\n".join(lines)


def render_unit(settings: UnitSettings) -> str:
    for word in command_words(settings):
        if not PLAIN.fullmatch(word.replace("${", "").replace("}", "")):
            raise ValueError(f"{word!r} cannot stand in the unit's command line unquoted")
    header = (
        BOOTSTRAP_HEADER.format(node=settings.node, agent_env=settings.agent_env)
        if settings.node
        else DEPLOY_HEADER
    )
    return header + BODY.format(
        user=settings.user,
        group=settings.group,
        shared_env=settings.shared_env,
        agent_env=settings.agent_env,
        exec_start=exec_start(command_words(settings)),
    )


def env_value(value: str) -> str:
    """A value as both systemd's EnvironmentFile= and sh read it: bare when PLAIN, else in
    single quotes (which neither unescapes inside). A newline or a single quote has no such
    spelling, so it is refused."""
    if "\n" in value or "'" in value or "\\" in value:
        raise ValueError(f"{value!r}: a newline, single quote or backslash cannot be written")
    return value if PLAIN.fullmatch(value) else f"'{value}'"


def render_env_file(node: str, values: list[tuple[str, str]]) -> str:
    lines = [
        f"# The settings of node {node}'s agent, written by `llmgw node bootstrap`: running it",
        "# again rewrites this file. It holds the node's join token: keep it 0600.",
    ]
    lines += [f"{name}={env_value(value)}" for name, value in values]
    return "\n".join(lines) + "\n"


def start_command(settings: UnitSettings) -> str:
    """Where no systemd runs: one shell line that starts the agent as the unit would, its
    settings read from the same files (as root: the token's file is root's), the agent run as
    the unit's user."""
    words = [w.replace("${", '"$').replace("}", '"') for w in command_words(settings)]
    if settings.user != "root":
        words = ["runuser", "-u", settings.user, "--", *words]
    # EnvironmentFile=- reads the shared file only if it exists.
    shared = f"[ ! -e {settings.shared_env} ] || . {settings.shared_env}"
    script = f"umask 077 && {shared} && . {settings.agent_env} && exec {' '.join(words)}"
    return f"sh -ac '{script}'"


if __name__ == "__main__":
    print(render_unit(DEPLOY_EXAMPLE), end="")
