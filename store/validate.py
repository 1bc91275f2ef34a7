"""Checks on what callers hand the store, shared by both backends.

Every text that reaches a table passes one of these first, so a bad value becomes a ValueError
that names the field instead of a database error (PostgreSQL refuses NUL bytes and lone
surrogates outright; SQLite would store them and hand back something else later).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:-]{0,63}")
MAX_NAME_CHARS = 128
# Long enough for a JWT-style upstream token, short enough to stay a sane header.
MAX_UPSTREAM_KEY_CHARS = 8192


def _shown(value: str) -> str:
    # Errors quote the offending value, but never a page of it.
    return repr(value if len(value) <= 40 else value[:40] + "...")


def check_key_name(name: str) -> str:
    # Names show up in CLI tables and logs: keep them printable and short. fullmatch, because
    # `$` would also accept a trailing newline.
    if not _NAME_RE.fullmatch(name):
        raise ValueError(
            f"invalid key name {_shown(name)}: use 1-64 letters, digits or . _ @ : - "
            "starting with a letter or digit"
        )
    return name


def check_text(value: str, field: str) -> str:
    """A model, adapter or usage name: 1-128 printable characters. Printable excludes control
    and format characters (NUL, newlines, the right-to-left override that makes a name read
    differently from what it is) and lone surrogates; any other Unicode, emoji included, is
    kept exactly."""
    if not 1 <= len(value) <= MAX_NAME_CHARS or not value.isprintable():
        raise ValueError(
            f"invalid {field} {_shown(value)}: use 1-{MAX_NAME_CHARS} printable characters "
            "(no control or formatting characters)"
        )
    return value


def check_allowlist(values: Iterable[str] | None, field: str) -> list[str] | None:
    """A key's list of model or adapter names: None allows all; otherwise sorted, deduplicated,
    each name checked."""
    if values is None:
        return None
    cleaned = sorted({check_text(v.strip(), field) for v in values})
    if not cleaned:
        # An empty allowlist would make a key that opens nothing: almost surely a mistake.
        raise ValueError(f"a key's {field} list must name at least one {field} (or be omitted)")
    return cleaned


def check_models(models: Iterable[str] | None) -> list[str] | None:
    return check_allowlist(models, "model")


def check_adapters(adapters: Iterable[str] | None) -> list[str] | None:
    return check_allowlist(adapters, "adapter")


def check_upstream_key(key: str) -> str:
    # Sent as an HTTP header, so visible ASCII only. The message never quotes the key: it is a
    # secret, and errors end up in logs.
    if not 1 <= len(key) <= MAX_UPSTREAM_KEY_CHARS or not all("!" <= ch <= "~" for ch in key):
        raise ValueError(
            f"invalid upstream key: use 1-{MAX_UPSTREAM_KEY_CHARS} visible ASCII characters "
            "without spaces"
        )
    return key


def storable(value: str) -> bool:
    """Whether a lookup value could ever match a stored one. A value no check above accepts
    simply finds nothing, rather than reaching a database that would choke on it."""
    return len(value) <= MAX_UPSTREAM_KEY_CHARS and value.isprintable()


def utc(moment: datetime | None) -> datetime | None:
    """Naive datetimes are taken as UTC, so a CLI date without a zone means what it says."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)
