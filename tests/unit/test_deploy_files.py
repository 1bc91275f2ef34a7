"""Every file in deploy/ parses as its tool reads it, and asks llmgw only for what llmgw takes:
each `llmgw` command line goes through the real CLI parser, each LLMGW_* variable is one llmgw's
code reads, and each setting a unit or Compose file expands is documented in its env example.

Compose files are checked against the Compose specification's schema and Kubernetes manifests
against Kubernetes' own (both bundled with their Python packages: nothing is fetched, no
container runs). Nothing here starts Temporal, PostgreSQL or a container: whether the images
start with these settings was not verified by a test.
"""

import json
import os
import re
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy_kit import (
    DEPLOY,
    ROOT,
    Command,
    accepted_variables,
    compose_commands,
    env_assignments,
    expansions,
    kubernetes_commands,
    markdown_commands,
    parse_error,
    parse_unit,
    strings,
    unit_commands,
    used_variables,
)

# Made per install and ignored by git (deploy/.gitignore): not part of what ships.
LOCAL = ("compose/tls/", "compose/.env")
FILES = sorted(
    p for p in DEPLOY.rglob("*") if p.is_file() and not str(p.relative_to(DEPLOY)).startswith(LOCAL)
)
KUBERNETES_VERSION = "1.30.0"
UNIT_ENV_FILE = DEPLOY / "llmgw.env.example"
# Each Compose file's settings are documented in the env example beside it.
COMPOSE_ENV = {"compose.yaml": "compose.env.example", "agent.compose.yaml": "agent.env.example"}
DOCS = [ROOT / "docs" / "operations.md"]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def compose_schema() -> dict[str, Any]:
    schema = resources.files("check_jsonschema.builtin_schemas").joinpath(
        "vendor/compose-spec.json"
    )
    return dict(json.loads(schema.read_text()))


def load(path: Path) -> list[Any]:
    """Parse one file as its tool does; raises on anything malformed."""
    name = path.name
    text = path.read_text()
    if name.endswith((".yaml", ".yml")):
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
        assert docs, f"{rel(path)} is empty"
        return docs
    if name.endswith(".json"):
        return [json.loads(text)]
    if name.endswith(".service"):
        return [parse_unit(text, rel(path))]
    if name.endswith(".env.example"):
        return [env_assignments(text, rel(path))]
    if name == "Dockerfile":
        for line in text.splitlines():
            word = line.split(maxsplit=1)[0] if line.strip() else "#"
            assert word.startswith("#") or line.startswith(" ") or word in DOCKERFILE_WORDS, (
                f"{rel(path)}: {line!r}"
            )
        return [text]
    if name.endswith(".sh"):
        checked = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert checked.returncode == 0, f"{rel(path)}: {checked.stderr}"
        assert os.access(path, os.X_OK), f"{rel(path)} is not executable"
        return [text]
    if name.endswith((".md", ".sql", ".dockerignore", ".gitignore")):
        assert text.strip(), f"{rel(path)} is empty"
        return [text]
    raise AssertionError(f"{rel(path)}: no check knows this kind of file; add one here")


DOCKERFILE_WORDS = {"FROM", "RUN", "COPY", "ENV", "USER", "WORKDIR", "CMD", "ARG", "LABEL"}


def all_commands() -> list[Command]:
    unit_defaults = env_assignments(UNIT_ENV_FILE.read_text(), rel(UNIT_ENV_FILE))
    found: list[Command] = []
    for path in FILES:
        name = rel(path)
        if path.suffix == ".service":
            found += unit_commands(parse_unit(path.read_text(), name), name, unit_defaults)
        elif path.name in COMPOSE_ENV:
            env = env_assignments((path.parent / COMPOSE_ENV[path.name]).read_text(), name)
            found += compose_commands(yaml.safe_load(path.read_text()), name, env)
        elif path.parent.name == "kubernetes":
            for doc in yaml.safe_load_all(path.read_text()):
                found += kubernetes_commands(doc, name)
        elif path.suffix == ".md":
            found += markdown_commands(path.read_text(), name)
        elif path.name == "Dockerfile":
            for match in re.finditer(r"^CMD (\[.*\])$", path.read_text(), re.M):
                found.append(Command(f"{name} CMD", json.loads(match[1])))
    for doc in DOCS:
        found += markdown_commands(doc.read_text(), rel(doc))
    return found


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_deploy_file_parses(path: Path) -> None:
    load(path)


@pytest.mark.parametrize("name", sorted(COMPOSE_ENV))
def test_compose_files_follow_the_compose_specification(name: str) -> None:
    doc = yaml.safe_load((DEPLOY / "compose" / name).read_text())
    schema = compose_schema()
    errors = sorted(jsonschema.validators.validator_for(schema)(schema).iter_errors(doc), key=str)
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]


@pytest.mark.parametrize("path", sorted((DEPLOY / "kubernetes").glob("*.yaml")), ids=str)
def test_kubernetes_manifests_follow_the_kubernetes_schema(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_every_llmgw_command_line_is_one_the_cli_takes() -> None:
    commands = all_commands()
    # Each role is started somewhere in deploy/, so a parser change that breaks one shows here.
    started = {c.argv[1] for c in commands if len(c.argv) > 1}
    assert {"control", "gateway", "agent"} <= started
    refused = [
        f"{c.where}: {' '.join(c.argv)}: {error}"
        for c in commands
        if (error := parse_error(c.argv)) is not None
    ]
    assert refused == []


def test_every_llmgw_variable_is_one_llmgw_reads() -> None:
    accepted = accepted_variables()
    # The settings this work added, as a sanity check that the scan sees constants in dicts.
    assert {"LLMGW_TEMPORAL_TLS_CA", "LLMGW_TEMPORAL_API_KEY_FILE"} <= accepted
    unknown = {
        rel(path): sorted(used_variables(path.read_text()) - accepted) for path in [*FILES, *DOCS]
    }
    assert {k: v for k, v in unknown.items() if v} == {}


def test_unit_settings_have_defaults_and_are_documented() -> None:
    documented = env_assignments(UNIT_ENV_FILE.read_text(), rel(UNIT_ENV_FILE))
    used: set[str] = set()
    for path in sorted((DEPLOY / "systemd").glob("*.service")):
        unit = parse_unit(path.read_text(), rel(path))
        expanded = set().union(*(expansions(line) for line in unit.values("ExecStart")))
        used |= expanded
        # A variable with no default in the unit would reach the command line empty.
        assert expanded <= set(unit.environment()), rel(path)
        assert expanded <= set(documented), rel(path)
    # And nothing in the env file is left over from a flag that no unit passes any more.
    for_units = {n for n in documented if not n.startswith("LLMGW_")}
    assert for_units - used <= {"PIP_INDEX_URL"}


@pytest.mark.parametrize("name", sorted(COMPOSE_ENV))
def test_compose_settings_are_documented(name: str) -> None:
    doc = yaml.safe_load((DEPLOY / "compose" / name).read_text())
    documented = env_assignments((DEPLOY / "compose" / COMPOSE_ENV[name]).read_text(), name)
    used = set().union(*(expansions(value) for value in strings(doc)))
    assert "AGENT_NODE" in used or "POSTGRES_PASSWORD" in used
    assert used - set(documented) == set()


# --- the checks themselves catch what they are for -------------------------------------------

BAD_UNIT = """\
[Service]
Environment=AGENT_NODE=n1
ExecStart=/opt/llmgw/.venv/bin/llmgw agent --node ${AGENT_NODE} \\
    --no-such-flag 1
"""


def test_an_unknown_flag_in_a_unit_is_caught() -> None:
    (command,) = unit_commands(parse_unit(BAD_UNIT, "bad.service"), "bad.service", {})
    assert command.argv[:4] == ["/opt/llmgw/.venv/bin/llmgw", "agent", "--node", "n1"]
    assert "--no-such-flag" in str(parse_error(command.argv))
    # An abbreviation argparse would take today is refused too.
    assert "--metrics-p" in str(parse_error(["llmgw", "agent", "--metrics-p", "8005"]))


def test_an_unknown_flag_or_command_in_compose_and_kubernetes_is_caught() -> None:
    compose = {"services": {"gw": {"command": ["llmgw", "gateway", "--prot", "8000"]}}}
    (command,) = compose_commands(compose, "compose.yaml", {})
    assert parse_error(command.argv) is not None
    pod = {"spec": {"containers": [{"name": "a", "command": ["sh", "-c", "exec llmgw agnet"]}]}}
    (command,) = kubernetes_commands(pod, "pod.yaml")
    assert "invalid choice: 'agnet'" in str(parse_error(command.argv))


def test_an_unknown_variable_is_caught() -> None:
    text = "LLMGW_TEMPORAL_ADDRESS=a\nLLMGW_TEMPORAL_TLS_CERTIFICATE=/etc/llmgw/tls/c.pem\n"
    assert used_variables(text) - accepted_variables() == {"LLMGW_TEMPORAL_TLS_CERTIFICATE"}
    # The API key as a value is refused by llmgw, so it is no setting a deploy file may use.
    assert "LLMGW_TEMPORAL_API_KEY" not in accepted_variables()


def test_the_image_copies_every_package_of_llmgw() -> None:
    """A package left out of the Dockerfile's COPY lines installs nothing and fails at the first
    import in the container (store/ was left out when it moved out of gateway/)."""
    root = DEPLOY.parent
    packages = {
        p.name for p in root.iterdir() if (p / "__init__.py").exists() and p.name != "tests"
    }
    copied = {
        line.split()[1]
        for line in (DEPLOY / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ") and len(line.split()) == 3
    }
    assert packages, "no packages found"
    assert packages <= copied, f"not copied into the image: {sorted(packages - copied)}"
