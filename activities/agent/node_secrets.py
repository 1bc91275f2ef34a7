"""Secrets kept on this node for its engines: one 0600 file per name in a 0700 directory under
the agent's state directory. Read by the agent when it starts an engine whose profile's env
says `NAME: secret:hf-token` (workflows/env_secrets.py).

Why on the node and not in the gateway's store (where upstream keys are): an agent talks to
Temporal only, never to the store, and anything it fetched through a workflow or an activity
result would be in history, which is what referencing by name avoids. The operator sets the
secret on each node that serves the model: `llmgw secret set NAME [--node N]`, value on stdin.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
from pathlib import Path

from workflows.env_secrets import SECRET_NAME, secret_ref


class SecretMissing(LookupError):
    """A referenced secret is not set on this node. The message names it, never a value."""


class SecretUnsafe(PermissionError):
    """A secret's file can be read by others than the agent's user: refused, not used."""


def _path(secrets_dir: Path, name: str) -> Path:
    if not SECRET_NAME.match(name):
        raise ValueError(f"invalid secret name {name!r}")
    return secrets_dir / name


def set_secret(secrets_dir: Path, name: str, value: str) -> None:
    path = _path(secrets_dir, name)
    secrets_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(secrets_dir, 0o700)
    # 0600 from creation (mkstemp), then renamed over: never readable by others, never torn.
    fd, tmp = tempfile.mkstemp(dir=secrets_dir, prefix=".new-")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(value)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remove_secret(secrets_dir: Path, name: str) -> bool:
    try:
        _path(secrets_dir, name).unlink()
    except FileNotFoundError:
        return False
    return True


def read_secret(secrets_dir: Path, name: str) -> str:
    path = _path(secrets_dir, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise SecretMissing(f"secret {name!r} is not set on this node") from None
    except OSError as err:  # a symlink (ELOOP), or unreadable
        raise SecretUnsafe(f"secret {name!r} cannot be read safely: {err.strerror}") from None
    with os.fdopen(fd) as file:
        mode = os.fstat(file.fileno()).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise SecretUnsafe(
                f"secret {name!r} is readable by other users (mode {stat.S_IMODE(mode):o}); "
                f"chmod 600 {path}"
            )
        return file.read().rstrip("\n")


def resolve_env(env: dict[str, str], secrets_dir: Path) -> dict[str, str]:
    """`env` with every `secret:NAME` value replaced by the secret's value on this node.

    Raises SecretMissing or SecretUnsafe naming the variable and the secret."""
    resolved: dict[str, str] = {}
    for var, value in env.items():
        ref = secret_ref(value)
        if ref is None:
            resolved[var] = value
            continue
        try:
            resolved[var] = read_secret(secrets_dir, ref)
        except ValueError as err:
            raise SecretMissing(f"env {var}: {err}") from None
        except (SecretMissing, SecretUnsafe) as err:
            raise type(err)(f"env {var}: {err}") from None
    return resolved


def main(argv: list[str], secrets_dir: Path) -> int:
    """`set NAME` (value from stdin, so it is in no shell history or process list), `rm NAME`,
    `ls`."""
    if argv[:1] == ["ls"] and len(argv) == 1:
        names = sorted(p.name for p in secrets_dir.glob("*") if not p.name.startswith("."))
        print("\n".join(names) if names else "no secrets on this node")
        return 0
    if len(argv) != 2 or argv[0] not in ("set", "rm"):
        print("usage: secret set NAME (value on stdin) | secret rm NAME | secret ls")
        return 2
    verb, name = argv
    if not SECRET_NAME.match(name):
        print(f"invalid secret name {name!r}: lower-case letters, digits, '.', '_', '-'")
        return 2
    if verb == "set":
        value = sys.stdin.readline() if not sys.stdin.isatty() else _prompt(name)
        set_secret(secrets_dir, name, value.rstrip("\n"))
        print(f"secret {name} set on this node")
        return 0
    print(f"secret {name} removed" if remove_secret(secrets_dir, name) else f"no secret {name}")
    return 0


def _prompt(name: str) -> str:
    import getpass

    return getpass.getpass(f"value of secret {name}: ")
