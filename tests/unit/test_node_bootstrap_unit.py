"""The agent's unit and environment file, as `llmgw node bootstrap` writes them and as
deploy/systemd holds the example: one template, a command line the CLI takes, the token only in
the 0600 file, and the start command printed where no systemd runs doing what systemd would
(tests/systemd_exec.py stands in for systemd)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy_kit import DEPLOY, parse_error
from tests.systemd_exec import service
from workers.commands.node_bootstrap.unit import (
    DEPLOY_EXAMPLE,
    UnitSettings,
    env_value,
    render_env_file,
    render_unit,
    start_command,
)

TOKEN = "llmgw-join-eyJub2RlIjogIm4xIn0"
# Stands in for llmgw: prints what it was started with.
REPORTER = """#!{python}
import json, os, sys
umask = os.umask(0)
print(json.dumps({{"argv": sys.argv[1:], "umask": umask,
                  "env": {{k: v for k, v in os.environ.items() if k.isupper()}}}}))
"""


def test_the_deploy_example_is_the_template_rendered() -> None:
    example = (DEPLOY / "systemd" / "llmgw-agent.service").read_text()
    assert example == render_unit(DEPLOY_EXAMPLE), (
        "deploy/systemd/llmgw-agent.service differs from its template: run "
        "`python -m workers.commands.node_bootstrap.unit > deploy/systemd/llmgw-agent.service`"
    )


def settings(tmp_path: Path, llmgw: str = "/opt/llmgw/.venv/bin/llmgw") -> UnitSettings:
    return UnitSettings(
        llmgw=llmgw, user="root", group="root", config_dir=str(tmp_path), node="n1",
        agent_flags=("--label", "pool=a", "--engine-path", "llamacpp=/opt/ls",
                     "--heartbeat-every=2"),
    )  # fmt: skip


def write_env(tmp_path: Path, extra: list[tuple[str, str]] = []) -> None:  # noqa: B006
    values = [
        ("AGENT_NODE", "n1"), ("AGENT_ADDRESS", "10.0.0.11"), ("AGENT_METRICS_PORT", "0"),
        ("LLMGW_STATE_DIR", "/srv/llmgw state"), *extra, ("LLMGW_JOIN_TOKEN", TOKEN),
    ]  # fmt: skip
    (tmp_path / "agent.env").write_text(render_env_file("n1", values))


def test_what_systemd_runs_is_a_command_line_the_cli_takes_with_the_token_in_the_environment(
    tmp_path: Path,
) -> None:
    unit = render_unit(settings(tmp_path))
    assert TOKEN not in unit
    write_env(tmp_path)
    ran = service(unit, hostname="box")
    assert ran.argv == ["/opt/llmgw/.venv/bin/llmgw", "agent", "--node", "n1",
                        "--address", "10.0.0.11", "--metrics-host", "10.0.0.11",
                        "--metrics-port", "0", "--label", "pool=a",
                        "--engine-path", "llamacpp=/opt/ls", "--heartbeat-every=2"]  # fmt: skip
    assert parse_error(ran.argv) is None
    assert ran.env["LLMGW_JOIN_TOKEN"] == TOKEN
    # The env file wins over the unit's Environment= defaults; a quoted value keeps its space.
    assert ran.env["LLMGW_STATE_DIR"] == "/srv/llmgw state"
    assert ran.env["LLMGW_CACHE_DIR"] == "/var/cache/llmgw"
    assert (ran.user, ran.umask) == ("root", 0o077)


@pytest.mark.skipif(os.geteuid() != 0, reason="the start command is run as root")
def test_the_start_command_without_systemd_runs_what_systemd_would(tmp_path: Path) -> None:
    reporter = tmp_path / "llmgw"
    reporter.write_text(REPORTER.format(python=sys.executable))
    reporter.chmod(0o755)
    unit = render_unit(settings(tmp_path, str(reporter)))
    write_env(tmp_path, [("PIP_INDEX_URL", "https://mirror.example/simple")])
    # The shared file, read first and overridden by the agent's own.
    (tmp_path / "llmgw.env").write_text("AGENT_ADDRESS=10.9.9.9\nHTTPS_PROXY=http://proxy:3128\n")
    expected = service(unit, hostname="box")
    line = start_command(settings(tmp_path, str(reporter)))
    done = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin"}, check=True)  # fmt: skip
    seen = json.loads(done.stdout)
    assert seen["argv"] == expected.argv[1:]
    assert seen["umask"] == expected.umask
    for name in ("LLMGW_JOIN_TOKEN", "LLMGW_STATE_DIR", "PIP_INDEX_URL", "HTTPS_PROXY"):
        assert seen["env"][name] == expected.env[name], name
    assert TOKEN not in line


def test_env_values_are_quoted_for_systemd_and_sh_alike_or_refused() -> None:
    assert env_value("10.0.0.11") == "10.0.0.11"
    assert env_value("a b$c") == "'a b$c'"
    for bad in ("it's", "two\nlines", "back\\slash"):
        with pytest.raises(ValueError, match="cannot be written"):
            env_value(bad)
    with pytest.raises(ValueError, match="unquoted"):
        render_unit(UnitSettings(llmgw="/opt/my llmgw", user="u", group="u", config_dir="/e"))
