"""What systemd would execute for a unit's ExecStart=, for tests on machines (network-namespace
hosts, containers) where no systemd runs: the command line and the environment, as
systemd.exec(5) and systemd.service(5) build them.

Followed: a fresh environment (systemd's PATH, then Environment= in order, then each
EnvironmentFile= in order, `-` for an optional one, a later setting winning; files hold
NAME=VALUE lines, `#` and `;` comments, single or double quotes), the specifiers %S, %C, %H and
%%, and ExecStart's variables: `${NAME}` inside a word becomes the value, a word that is exactly
`$NAME` becomes the value split at whitespace (nothing when empty or unset). Left to the caller:
User=, UMask= and the directories systemd would make (StateDirectory=, CacheDirectory=).
"""

import re
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path

from tests.deploy_kit import parse_unit

# systemd's default PATH for services (merged-/usr systems drop the last two).
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SPECIFIERS = {"S": "/var/lib", "C": "/var/cache", "%": "%"}
BRACED = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
BARE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class Service:
    argv: list[str]
    env: dict[str, str]
    user: str
    umask: int


def specifiers(text: str, hostname: str) -> str:
    def one(found: re.Match[str]) -> str:
        letter = found[1]
        if letter == "H":
            return hostname
        if letter not in SPECIFIERS:
            raise ValueError(f"specifier %{letter} is not known to this stand-in")
        return SPECIFIERS[letter]

    return re.sub(r"%(.)", one, text)


def environment_file(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        name, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"not NAME=VALUE: {raw!r}")
        words = shlex.split(value)
        found[name.strip()] = " ".join(words)
    return found


def command(line: str, env: dict[str, str]) -> list[str]:
    argv: list[str] = []
    for word in shlex.split(line):
        bare = BARE.fullmatch(word)
        if bare:
            argv += env.get(bare[1], "").split()
        else:
            argv.append(BRACED.sub(lambda m: env.get(m[1], ""), word))
    return argv


def service(unit_text: str, hostname: str | None = None) -> Service:
    host = hostname or socket.gethostname()
    unit = parse_unit(unit_text, "unit")
    env = {"PATH": SYSTEMD_PATH}
    for line in unit.values("Environment"):
        for item in shlex.split(specifiers(line, host)):
            name, _, value = item.partition("=")
            env[name] = value
    for line in unit.values("EnvironmentFile"):
        path = Path(specifiers(line.removeprefix("-"), host))
        if not path.exists() and line.startswith("-"):
            continue
        env.update(environment_file(path.read_text()))
    [start] = unit.values("ExecStart")
    [user] = unit.values("User") or ["root"]
    [umask] = unit.values("UMask") or ["0022"]
    return Service(command(specifiers(start, host), env), env, user, int(umask, 8))
