"""An external model's upstream API key, as `llmgw model add` and a models YAML name it: read
from a file or an environment variable, never given on the command line (shell history, `ps`)
or in the YAML itself, and checked to be one line a header can carry. Messages never quote it.
"""

import argparse
import os
from pathlib import Path
from typing import Any

from workflows.catalog import EXTERNAL

# Where a model definition in YAML names its upstream key (never the key itself).
KEY_FILE_FIELD = "upstream_key_file"
KEY_ENV_FIELD = "upstream_key_env"


def upstream_key_from_args(args: argparse.Namespace) -> str | None:
    """The key `--upstream-key-file` or `--upstream-key-env` names, or None if neither."""
    if args.upstream_key_file is None and args.upstream_key_env is None:
        return None
    if args.engine != EXTERNAL:
        raise SystemExit(f"an upstream key is for --engine {EXTERNAL} only")
    if args.upstream_key_file is not None:
        return read_key_file(Path(args.upstream_key_file))
    return read_key_env(args.upstream_key_env)


def read_key_file(path: Path) -> str:
    try:
        text = path.expanduser().read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise SystemExit(f"upstream key file {path}: {err}") from None
    return plain_key(text, f"upstream key file {path}")


def read_key_env(name: str) -> str:
    value = os.environ.get(name)
    if value is None:
        raise SystemExit(f"upstream key: ${name} is not set")
    return plain_key(value, f"upstream key ${name}")


def plain_key(text: str, where: str) -> str:
    """The key without the newline an editor or `echo` leaves; one line of visible characters
    (it travels as an HTTP header). Messages never quote it."""
    key = text.strip()
    if not key:
        raise SystemExit(f"{where} is empty")
    if any(not "!" <= ch <= "~" for ch in key):
        raise SystemExit(f"{where}: a key is one line of visible ASCII characters, no spaces")
    return key


def key_from_entry(entry: dict[str, Any], base: Path, where: str) -> str | None:
    """Take the upstream key fields out of a YAML entry (they are not part of the spec)."""
    if "upstream_key" in entry:
        raise SystemExit(
            f"{where}: upstream_key: name a file ({KEY_FILE_FIELD}) or an environment "
            f"variable ({KEY_ENV_FIELD}) holding the key, not the key itself"
        )
    file, env = entry.pop(KEY_FILE_FIELD, None), entry.pop(KEY_ENV_FIELD, None)
    if file is not None and env is not None:
        raise SystemExit(f"{where}: give {KEY_FILE_FIELD} or {KEY_ENV_FIELD}, not both")
    if file is not None:
        return read_key_file(base / Path(str(file)).expanduser())
    if env is not None:
        return read_key_env(str(env))
    return None
