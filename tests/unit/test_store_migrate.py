"""Moving a whole store between backends: export, import, and `migrate` with its refusal and its
read-back check (fixtures and backends from test_store)."""

# Fixtures are imported by name and then requested as parameters of the same name.
# ruff: noqa: F811

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest

from gateway.auth import KeyCache
from store import KeyLimits, KeyNameTaken, Store, StoreDump, UsageDelta
from store.migrate import TargetNotEmpty, dump_differences, migrate
from tests.unit.test_store import Backend, backend, backend_named  # noqa: F401
from workflows.engine_keys import engine_key_from_master


async def _fill(store: Store) -> dict[str, str]:
    """A store with one of everything; returns the plaintext keys by name."""
    await store.master_secret()
    await store.set_upstream_key("gpt-4o", "sk-upstream")
    old, _ = await store.create_key("rotated")
    await store.revoke_key(old.key_id)
    _, rotated = await store.create_key("rotated", models=["m1", "m2"])
    _, limited = await store.create_key(
        "limited",
        adapters=["lora-\U0001f999"],
        limits=KeyLimits(rpm=30, tpm=900, token_budget=10**12, budget_period="month"),
        expires_at=datetime.now(UTC) + timedelta(days=3),
    )
    await store.add_usage(
        [
            UsageDelta(
                key_id=old.key_id,
                model="m1",
                day=date(2025, 1, 1) + timedelta(days=i),
                requests=i + 1,
                prompt_tokens=7 * i,
                completion_tokens=3 * i,
            )
            for i in range(40)
        ]
    )
    return {"rotated": rotated, "limited": limited}


def _same(a: StoreDump, b: StoreDump) -> None:
    assert dump_differences(a, b) == []
    assert dump_differences(b, a) == []
    assert a == b


async def test_sqlite_to_postgres_and_back_compares_equal(tmp_path: Path) -> None:
    async with (
        backend_named("sqlite", tmp_path / "first") as first,
        backend_named("postgres", tmp_path / "pg") as pg,
        backend_named("sqlite", tmp_path / "second") as second,
    ):
        source = await first.open()
        await _fill(source)
        original = await source.export_dump()
        assert len(original.secrets) == 2
        assert len(original.keys) == 3
        assert len(original.usage) == 40

        via_postgres = await pg.open()
        await migrate(source, via_postgres)
        _same(original, await via_postgres.export_dump())

        back = await second.open()
        report = await migrate(via_postgres, back)
        assert (report.keys, report.usage_rows, report.secrets) == (3, 40, 2)
        assert report.master_secret
        _same(original, await back.export_dump())
        assert await back.master_secret() == await source.master_secret()


async def test_postgres_to_sqlite_keeps_clients_and_engines_working(tmp_path: Path) -> None:
    async with (
        backend_named("postgres", tmp_path) as pg,
        backend_named("sqlite", tmp_path) as lite,
    ):
        source = await pg.open()
        plaintexts = await _fill(source)
        target = await lite.open()
        await migrate(source, target)

        # Clients keep their keys: the new store authenticates the same plaintext.
        cache = KeyCache(target)
        await cache.refresh()
        for name, plaintext in plaintexts.items():
            key = await cache.authenticate(f"Bearer {plaintext}")
            assert key.name == name
        # Engines keep accepting the gateway: the same master derives the same engine key.
        assert engine_key_from_master(
            await target.master_secret(), "node-a", "m1-0"
        ) == engine_key_from_master(await source.master_secret(), "node-a", "m1-0")
        assert await target.upstream_keys() == {"gpt-4o": "sk-upstream"}


async def test_a_dump_survives_json(backend: Backend) -> None:
    store = await backend.open()
    await _fill(store)
    dump = await store.export_dump()
    # Raw secret bytes (not valid UTF-8) travel as base64.
    assert StoreDump.model_validate_json(dump.model_dump_json()) == dump


async def test_importing_twice_changes_nothing(backend: Backend, tmp_path: Path) -> None:
    async with backend_named("sqlite", tmp_path / "source") as other:
        source = await other.open()
        await _fill(source)
        dump = await source.export_dump()
    target = await backend.open()
    await target.import_dump(dump)
    await target.import_dump(dump)
    _same(dump, await target.export_dump())


async def test_a_forced_copy_can_keep_the_target_secrets(backend: Backend, tmp_path: Path) -> None:
    async with backend_named("sqlite", tmp_path / "source") as other:
        source = await other.open()
        await _fill(source)
        dump = await source.export_dump()
    target = await backend.open()
    own = await target.master_secret()
    await target.import_dump(dump, replace_secrets=False)
    assert await target.master_secret() == own
    assert await target.upstream_keys() == {"gpt-4o": "sk-upstream"}, "new secrets still arrive"
    await target.import_dump(dump)
    assert await target.master_secret() == dump.secrets["engine_master"]


async def test_migrate_refuses_a_target_with_keys_or_usage(
    backend: Backend, tmp_path: Path
) -> None:
    async with backend_named("sqlite", tmp_path / "source") as other:
        source = await other.open()
        await _fill(source)
        target = await backend.open()
        await target.add_usage([UsageDelta(key_id="theirs", model="m", day=date(2024, 1, 1))])
        with pytest.raises(TargetNotEmpty, match="0 key\\(s\\) and 1 usage row"):
            await migrate(source, target)
        assert await target.list_keys() == [], "a refusal writes nothing"

        await migrate(source, target, force=True)
        copied = await target.export_dump()
        assert dump_differences(await source.export_dump(), copied) == []
        assert any(u.key_id == "theirs" for u in copied.usage), "force adds, it does not wipe"


async def test_an_import_whose_active_name_is_taken_writes_nothing(
    backend: Backend, tmp_path: Path
) -> None:
    async with backend_named("sqlite", tmp_path / "source") as other:
        source = await other.open()
        await _fill(source)
        dump = await source.export_dump()
    target = await backend.open()
    theirs, _ = await target.create_key("limited")
    with pytest.raises(KeyNameTaken, match="limited"):
        await target.import_dump(dump)
    after = await target.export_dump()
    assert [k.key_id for k in after.keys] == [theirs.key_id]
    assert after.usage == []
    assert after.secrets == {}


async def test_an_import_may_revoke_and_replace_an_active_key(
    backend: Backend, tmp_path: Path
) -> None:
    # The target's active key is revoked by the dump while the dump's new key takes its name:
    # a valid end state, whatever order the rows are written in.
    target = await backend.open()
    first, _ = await target.create_key("svc")
    dump = await target.export_dump()
    revoked = first.model_copy(update={"revoked_at": datetime.now(UTC)})
    async with backend_named("sqlite", tmp_path / "scratch") as scratch:
        replacement, _ = await (await scratch.open()).create_key("svc")
    await target.import_dump(dump.model_copy(update={"keys": [replacement, revoked]}))
    active = [k.key_id for k in await target.list_keys() if k.revoked_at is None]
    assert active == [replacement.key_id]


async def test_a_dump_with_hostile_rows_is_refused_before_writing(backend: Backend) -> None:
    target = await backend.open()
    bad_usage = StoreDump.model_validate(
        {
            "usage": [
                {
                    "key_id": "k",
                    "model": "m\x00",
                    "day": "2025-01-01",
                    "requests": 1,
                    "prompt_tokens": 0,
                    "completion_tokens": 0,
                }
            ]
        }
    )
    with pytest.raises(ValueError, match="invalid usage model"):
        await target.import_dump(bad_usage)
    assert await target.usage() == []


def test_differences_name_rows_but_never_secret_values() -> None:
    expected = StoreDump(secrets={"engine_master": b"\x01" * 32})
    actual = StoreDump(secrets={"engine_master": b"\x02" * 32})
    (problem,) = dump_differences(expected, actual)
    assert "engine_master" in problem
    assert "\x01" not in problem
    assert "AQEB" not in problem


async def test_a_hand_edited_dump_that_renames_onto_a_name_is_a_clear_error(
    backend: Backend, tmp_path: Path
) -> None:
    target = await backend.open()
    mine, _ = await target.create_key("a")
    async with backend_named("sqlite", tmp_path / "scratch") as scratch:
        newcomer, _ = await (await scratch.open()).create_key("a")
    renamed = mine.model_copy(update={"name": "b"})
    with pytest.raises(ValueError, match="clash") as caught:
        await target.import_dump(StoreDump(keys=[newcomer, renamed]))
    assert type(caught.value) is ValueError
    assert [(k.key_id, k.name) for k in await target.list_keys()] == [(mine.key_id, "a")]
