"""Checks on what callers hand the store, shared by both backends."""

from __future__ import annotations

import re
from datetime import UTC, datetime

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@:-]{0,63}$")


def check_key_name(name: str) -> str:
    # Names show up in CLI tables and logs: keep them printable and short.
    if not _NAME_RE.match(name):
        raise ValueError(
            f"invalid key name {name!r}: use 1-64 letters, digits or . _ @ : - "
            "starting with a letter or digit"
        )
    return name


def check_models(models: list[str] | None) -> list[str] | None:
    if models is None:
        return None
    cleaned = sorted({m.strip() for m in models})
    if not cleaned or any(not m for m in cleaned):
        # An empty allowlist would make a key that opens nothing: almost surely a mistake.
        raise ValueError("a key's model list must name at least one model (or be omitted)")
    return cleaned


def utc(moment: datetime | None) -> datetime | None:
    """Naive datetimes are taken as UTC, so a CLI date without a zone means what it says."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)
