"""Reading deploy/'s files the way their tools do, to find every `llmgw` command line and every
variable in them (tests/unit/test_deploy_files.py).

What llmgw accepts is taken from the code itself: command lines go through the real argparse
parser (workers/cli.py), and the LLMGW_* variables are the names llmgw's packages spell out.
"""

import argparse
import ast
import contextlib
import io
import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.source_reading import parse_file
from workers.cli import build_parser
from workers.temporal_flags import REFUSED_KEY_VARIABLE

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
PACKAGES = ("workflows", "kv", "engines", "store", "activities", "gateway", "workers")
LLMGW_VARIABLE = re.compile(r"\bLLMGW_[A-Z0-9_]*[A-Z0-9]\b")
# ${NAME}, ${NAME:-default}, ${NAME:?message} (systemd, Compose, sh), $(NAME) (Kubernetes), $NAME.
EXPANSION = re.compile(
    r"\$\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    r"|\$\((?P<paren>[A-Za-z_][A-Za-z0-9_]*)\)"
    r"|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)"
)
PLACEHOLDER = "placeholder"
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class Command:
    where: str  # file and place, for the failure message
    argv: list[str]


def accepted_variables() -> set[str]:
    """Every LLMGW_* name written in llmgw's own code, less test knobs and the refused name."""
    names: set[str] = set()
    # `make test`'s runner too: its knobs (LLMGW_REQUIRE_*) are an operator's to set.
    sources = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py")]
    for path in [*sources, ROOT / "tests" / "run.py"]:
        for node in ast.walk(parse_file(path)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.update(LLMGW_VARIABLE.findall(node.value))
    return {n for n in names if not n.startswith("LLMGW_TEST_") and n != REFUSED_KEY_VARIABLE}


def used_variables(text: str) -> set[str]:
    return set(LLMGW_VARIABLE.findall(text))


def expand(text: str, values: Mapping[str, str]) -> str:
    """Variables replaced as the deploying tool would, with a stand-in where none is known."""

    def one(match: re.Match[str]) -> str:
        name = match["braced"] or match["paren"] or match["bare"]
        if name in values:
            return values[name]
        if match["op"] in (":-", "-"):
            return str(match["arg"])
        return PLACEHOLDER

    return EXPANSION.sub(one, text)


def expansions(text: str) -> set[str]:
    return {m["braced"] or m["paren"] or m["bare"] for m in EXPANSION.finditer(text)}


def strings(doc: Any) -> Iterator[str]:
    """Every string value in parsed YAML: what Compose interpolates (comments are not)."""
    if isinstance(doc, str):
        yield doc
    elif isinstance(doc, dict):
        for value in doc.values():
            yield from strings(value)
    elif isinstance(doc, list):
        for value in doc:
            yield from strings(value)


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every flag spelled out anywhere in the parser and its subcommands."""
    found: set[str] = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= option_strings(sub)
    return found


def parse_error(argv: list[str]) -> str | None:
    """What `llmgw` says about this command line, or None if its parser takes it. A flag must
    be spelled out: argparse would take `--metrics-p` for `--metrics-port`, until a new flag
    makes the abbreviation ambiguous."""
    flags = option_strings(build_parser())
    abbreviated = [w for w in argv if w.startswith("--") and w.split("=")[0] not in flags]
    if abbreviated:
        return f"not a flag spelled out in full: {abbreviated}"
    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            build_parser().parse_args(argv[1:])
    except SystemExit as stop:
        if stop.code not in (0, None):
            return err.getvalue().strip().splitlines()[-1]
    return None


def is_llmgw(word: str) -> bool:
    return word.lstrip("-@+!:").rsplit("/", 1)[-1] == "llmgw"


SHELL_PREFIXES = ("exec", "env", "nice", "sudo")
TAKES_VALUE = ("-u", "-g", "-n")  # sudo -u USER, sudo -g GROUP, nice -n N


def _strip_prefixes(words: list[str]) -> list[str]:
    """`sudo -u llmgw env A=B exec llmgw ...` -> `llmgw ...`"""
    while words:
        word = words[0]
        if word in TAKES_VALUE:
            words = words[2:]
        elif (
            word in SHELL_PREFIXES
            or word.startswith("-")
            or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", word)
        ):
            words = words[1:]
        else:
            break
    return words


def _inside_container(words: list[str]) -> list[str]:
    """`docker compose exec gateway llmgw ...`, `kubectl exec POD -- llmgw ...` -> `llmgw ...`"""
    if words[:1] not in (["docker"], ["kubectl"]):
        return words
    if "--" in words:
        return words[words.index("--") + 1 :]
    if "exec" in words:
        rest = words[words.index("exec") + 1 :]
        while rest and rest[0].startswith("-"):  # exec's own options (-T), then the service
            rest = rest[1:]
        return rest[1:]
    return []


def commands_in_script(script: str, where: str) -> Iterator[Command]:
    """`llmgw` invocations in a shell script (`sh -c`, a README's code block): one per command,
    lines joined where they end in a backslash."""
    for line in script.replace("\\\n", " ").splitlines():
        if "llmgw" not in line:
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError as err:  # an unbalanced quote: say where
            raise ValueError(f"{where}: {err}: {line!r}") from None
        segment: list[str] = []
        for word in [*words, ";"]:
            if word not in (";", "&&", "||", "|"):
                segment.append(word)
                continue
            segment = _strip_prefixes(_inside_container(segment))
            if segment and is_llmgw(segment[0]):
                yield Command(where, segment)
            segment = []


def markdown_commands(text: str, name: str) -> Iterator[Command]:
    """Commands in a Markdown file's shell code blocks (```sh, ```bash, ``` with no language).
    Fences pair in order, so the closing fence of a ```yaml block never opens one."""
    for block in re.finditer(r"^```([a-z]*)\n(.*?)^```[ \t]*$", text, re.M | re.S):
        if block[1] in ("sh", "bash", "shell", ""):
            yield from commands_in_script(block[2], f"{name} code block")


# --- systemd units ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Unit:
    sections: dict[str, list[tuple[str, str]]]

    def values(self, key: str) -> list[str]:
        return [v for section in self.sections.values() for k, v in section if k == key]

    def environment(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for line in self.values("Environment"):
            for item in shlex.split(line):
                name, _, value = item.partition("=")
                env[name] = value
        return env


def parse_unit(text: str, name: str) -> Unit:
    """systemd's unit syntax: [Section] headers, Key=Value lines, `\\` continues a line, # and ;
    start comments. Raises ValueError for anything else."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    pending = ""
    for number, raw in enumerate(text.splitlines(), 1):
        line = pending + raw.strip()
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise ValueError(f"{name}:{number}: unclosed section header")
            current = sections.setdefault(line[1:-1], [])
            continue
        key, sep, value = line.partition("=")
        if current is None or not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", key.strip()):
            raise ValueError(f"{name}:{number}: not Key=Value in a section: {raw!r}")
        current.append((key.strip(), value.strip()))
    if pending:
        raise ValueError(f"{name}: the last line continues into nothing")
    return Unit(sections)


def unit_commands(unit: Unit, name: str, defaults: Mapping[str, str]) -> Iterator[Command]:
    values = {**defaults, **unit.environment()}
    for line in unit.values("ExecStart"):
        argv = shlex.split(expand(line, values))
        if argv and is_llmgw(argv[0]):
            yield Command(f"{name} ExecStart", argv)


# --- env files -------------------------------------------------------------------------------


def env_assignments(text: str, name: str) -> dict[str, str]:
    """NAME=value lines, set or commented out (`#NAME=value` documents a setting)."""
    found: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        match = re.fullmatch(r"#?([A-Za-z_][A-Za-z0-9_]*)=(.*)", line)
        if match:
            found[match[1]] = match[2]
        elif line and not line.startswith("#"):
            raise ValueError(f"{name}:{number}: neither a comment nor NAME=value: {raw!r}")
    return found


# --- Compose and Kubernetes ------------------------------------------------------------------


def compose_commands(
    doc: dict[str, Any], name: str, values: Mapping[str, str]
) -> Iterator[Command]:
    for service, spec in (doc.get("services") or {}).items():
        command = spec.get("command")
        if command is None:
            continue
        words = shlex.split(command) if isinstance(command, str) else [str(w) for w in command]
        argv = [expand(w, values) for w in words]
        if argv and is_llmgw(argv[0]):
            yield Command(f"{name} service {service}", argv)


def containers(doc: Any) -> Iterator[dict[str, Any]]:
    if isinstance(doc, dict):
        for key in ("containers", "initContainers"):
            yield from doc.get(key) or []
        for value in doc.values():
            yield from containers(value)
    elif isinstance(doc, list):
        for value in doc:
            yield from containers(value)


def kubernetes_commands(doc: dict[str, Any], name: str) -> Iterator[Command]:
    for container in containers(doc):
        words = [str(w) for w in (container.get("command") or []) + (container.get("args") or [])]
        env = {e["name"]: str(e.get("value", PLACEHOLDER)) for e in container.get("env") or []}
        where = f"{name} container {container.get('name')}"
        if words[:1] and words[0].rsplit("/", 1)[-1] in ("sh", "bash") and "-c" in words:
            script = words[words.index("-c") + 1]
            yield from commands_in_script(expand(script, env), where)
        elif words and is_llmgw(words[0]):
            yield Command(where, [expand(w, env) for w in words])
