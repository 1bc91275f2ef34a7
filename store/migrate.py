"""Copying a whole store to another one (SQLite to PostgreSQL when a fleet outgrows one machine,
or back), then reading the target back to prove the copy.

The engine master secret travels too: engines derive their keys from it, so a gateway on the
new store keeps being accepted by the engines already running.
"""

from __future__ import annotations

from pydantic import BaseModel

from store.base import Store
from store.models import StoreDump
from store.records import MASTER_SECRET_NAME


class TargetNotEmpty(RuntimeError):
    """The target already holds keys or usage; copying over them needs `force`."""


class MigrationReport(BaseModel):
    secrets: int
    keys: int
    usage_rows: int
    master_secret: bool


def dump_differences(expected: StoreDump, actual: StoreDump) -> list[str]:
    """What in `expected` is missing from or different in `actual`; rows only in `actual` are
    fine (a forced copy onto a store that had its own). Messages name rows, never secret
    values."""
    problems = [
        f"secret {name!r} missing or different"
        for name, value in expected.secrets.items()
        if actual.secrets.get(name) != value
    ]
    keys = {k.key_id: k for k in actual.keys}
    problems += [
        f"key {k.name!r} ({k.key_id}) missing or different"
        for k in expected.keys
        if keys.get(k.key_id) != k
    ]
    usage = {(u.key_id, u.model, u.day): u for u in actual.usage}
    problems += [
        f"usage of key {u.key_id} on {u.model!r} for {u.day} missing or different"
        for u in expected.usage
        if usage.get((u.key_id, u.model, u.day)) != u
    ]
    return problems


async def migrate(source: Store, target: Store, force: bool = False) -> MigrationReport:
    """Copy everything from source to target and verify it. Both must be initialised."""
    existing = await target.export_dump()
    if (existing.keys or existing.usage) and not force:
        raise TargetNotEmpty(
            f"the target already holds {len(existing.keys)} key(s) and "
            f"{len(existing.usage)} usage row(s); refusing to mix stores "
            "(use --force to copy over them: rows with the same identity are replaced)"
        )
    dump = await source.export_dump()
    await target.import_dump(dump, replace_secrets=True)
    problems = dump_differences(dump, await target.export_dump())
    if problems:
        raise RuntimeError("the copy does not read back as written: " + "; ".join(problems[:10]))
    return MigrationReport(
        secrets=len(dump.secrets),
        keys=len(dump.keys),
        usage_rows=len(dump.usage),
        master_secret=MASTER_SECRET_NAME in dump.secrets,
    )
