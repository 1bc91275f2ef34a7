"""The rules an imported dump must pass, shared by both backends: every row as the store's own
API would accept it, and an order of writes that keeps the one-active-name index true."""

from __future__ import annotations

from store.base import KeyNameTaken
from store.models import ApiKey, StoreDump
from store.records import UPSTREAM_KEY_PREFIX, usage_values
from store.validate import check_key_name, check_text, check_upstream_key


def check_dump(dump: StoreDump) -> None:
    """Refuse a dump with anything the store would not accept from its own API, before any row
    is written."""
    for name, value in dump.secrets.items():
        check_text(name, "secret name")
        if name.startswith(UPSTREAM_KEY_PREFIX):
            check_upstream_key(value.decode("ascii", errors="replace"))
    active: set[str] = set()
    for key in dump.keys:
        check_key_name(key.name)
        if key.revoked_at is None:
            if key.name in active:
                raise ValueError(f"the dump holds two unrevoked keys named {key.name!r}")
            active.add(key.name)
        check_text(key.key_id, "key_id")
        check_text(key.key_hash, "key_hash")
        # Each name exactly as it will be written: no stripping or sorting here.
        for field, names in (("model", key.models), ("adapter", key.adapters)):
            if names is not None and not names:
                raise ValueError(f"key {key.name!r} has an empty {field} list")
            for name in names or []:
                check_text(name, field)
    for row in dump.usage:
        usage_values(row, str)


def write_order(keys: list[ApiKey]) -> list[ApiKey]:
    """Revoked keys first: a key the dump revokes frees its name before an unrevoked key of the
    same name is written, so the one-active-name index holds after every row."""
    return sorted(keys, key=lambda k: k.revoked_at is None)


def name_conflicts(dump: StoreDump, holders: dict[str, str]) -> None:
    """Raise KeyNameTaken when a key outside the dump holds the name of an unrevoked key in it.
    `holders` maps each unrevoked name in the target to its key_id."""
    in_dump = {k.key_id for k in dump.keys}
    for key in dump.keys:
        holder = holders.get(key.name)
        if key.revoked_at is None and holder not in (None, key.key_id) and holder not in in_dump:
            raise KeyNameTaken(key.name)
