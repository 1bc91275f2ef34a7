"""Hostile text at every field that reaches the store, on both backends (fixtures from
test_store): it round-trips exactly, or it is a ValueError that names the field; never a raw
database error, and never a change to the tables."""

# Fixtures are imported by name and then requested as parameters of the same name.
# ruff: noqa: F811

from __future__ import annotations

from datetime import date

import pytest

from store import Store, UsageDelta
from tests.unit.test_store import backend, open_test_store, store  # noqa: F401

DAY = date(2025, 6, 1)

# Each is a legal model or adapter name and must come back character for character.
KEPT = {
    "sql quote": "x'); DROP TABLE api_keys;--",
    "double quote": 'm"); DELETE FROM usage_daily; --',
    "like wildcards": "100%_\\",
    "four-byte emoji": "llama-\U0001f999-\U0001d518nicode",
    "cjk": "模型-モデル",
    "longest": "m" * 128,
}
# Each must be refused, naming the field.
REFUSED = {
    "nul byte": "model\x00",
    "right-to-left override": "gpt\u202e4o",
    "newline": "model\nX-Injected: yes",
    "escape sequence": "\x1b[31mred",
    "lone surrogate": "bad\udc80",
    "too long": "m" * 129,
    "very long": "m" * 1_000_000,
    "empty": "",
}


@pytest.mark.parametrize("name", KEPT.values(), ids=KEPT.keys())
async def test_legal_but_hostile_names_round_trip_exactly(store: Store, name: str) -> None:
    record, _ = await store.create_key("k", models=[name], adapters=[name])
    await store.add_usage(
        [UsageDelta(key_id=record.key_id, model=name, day=DAY, requests=1, prompt_tokens=2)]
    )
    await store.set_upstream_key(name, "sk-test")

    stored = await store.get_key(record.key_id)
    assert stored is not None
    assert stored.models == [name]
    assert stored.adapters == [name]
    (row,) = await store.usage(model=name)
    assert row.model == name
    assert row.key_id == record.key_id
    assert await store.upstream_keys() == {name: "sk-test"}
    # The tables are all still there and still hold exactly this.
    assert [k.key_id for k in await store.list_keys()] == [record.key_id]
    assert len(await store.usage()) == 1


@pytest.mark.parametrize("name", REFUSED.values(), ids=REFUSED.keys())
async def test_unstorable_names_are_refused_naming_the_field(store: Store, name: str) -> None:
    cases = [
        ("model", store.create_key("k", models=[name])),
        ("adapter", store.create_key("k", adapters=[name])),
        ("usage model", store.add_usage([UsageDelta(key_id="k", model=name, day=DAY)])),
        ("usage key_id", store.add_usage([UsageDelta(key_id=name, model="m", day=DAY)])),
        ("model", store.usage(model=name)),
        ("key_id", store.usage(key_id=name)),
        ("key_id", store.spent_tokens(name, DAY)),
        ("model", store.set_upstream_key(name, "sk-test")),
    ]
    for field, call in cases:
        with pytest.raises(ValueError, match=f"invalid {field} ") as caught:
            await call
        assert type(caught.value) is ValueError, "a plain ValueError, not a driver error"
        assert len(str(caught.value)) < 300, "the message quotes a short piece, not the input"
    assert await store.list_keys() == []
    assert await store.usage() == []
    assert await store.upstream_keys() == {}


@pytest.mark.parametrize(
    "name",
    [
        "x'; DROP TABLE api_keys; --",
        "alice\n",
        "alice\x00",
        "\u202ealice",
        "\uff41lice",  # fullwidth a: looks like another key's name in a table
        "a" * 65,
    ],
)
async def test_key_names_keep_their_strict_rule(store: Store, name: str) -> None:
    with pytest.raises(ValueError, match="invalid key name"):
        await store.create_key(name)
    assert await store.list_keys() == []


@pytest.mark.parametrize("probe", ["x' OR '1'='1", "\x00", "a\udc80", "k" * 100_000])
async def test_lookups_with_hostile_text_find_nothing(store: Store, probe: str) -> None:
    record, _ = await store.create_key("victim")
    assert await store.get_key(probe) is None
    assert await store.revoke_key(probe) is False
    assert await store.set_key_limits(probe, record.limits) is None
    victim = await store.get_key(record.key_id)
    assert victim is not None
    assert victim.revoked_at is None
