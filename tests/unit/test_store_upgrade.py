"""A database made by the first released schema opens with its keys and usage intact, and gains
the new columns on init(), on both backends (fixtures from test_store)."""

# Fixtures are imported by name and then requested as parameters of the same name.
# ruff: noqa: F811

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
from datetime import UTC, date, datetime
from pathlib import Path

from store import KeyLimits
from store.dialect import POSTGRES, SQLITE
from store.schema import schema as schema_for
from store.sqlite import SqliteStore
from tests.unit.test_store import Backend, backend  # noqa: F401

# Exactly what the first schema created, per backend, plus one key and one usage row in it.
_OLD_SQLITE = """
CREATE TABLE secrets (name TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE api_keys (
    key_id TEXT PRIMARY KEY, name TEXT NOT NULL, key_hash TEXT NOT NULL, models TEXT,
    created_at TEXT NOT NULL, expires_at TEXT, revoked_at TEXT
);
CREATE UNIQUE INDEX api_keys_active_name ON api_keys (name) WHERE revoked_at IS NULL;
CREATE TABLE usage_daily (
    key_id TEXT NOT NULL, model TEXT NOT NULL, day TEXT NOT NULL,
    requests INTEGER NOT NULL DEFAULT 0, prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (key_id, model, day)
);
INSERT INTO secrets VALUES ('engine_master',
    x'00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff');
INSERT INTO api_keys VALUES ('0a1b2c3d', 'legacy', '{hash}', '["m1"]',
    '2025-01-02T03:04:05.000006+00:00', NULL, NULL);
INSERT INTO usage_daily VALUES ('0a1b2c3d', 'm1', '2025-01-02', 3, 30, 12);
"""
_OLD_POSTGRES = """
CREATE TABLE secrets (name TEXT PRIMARY KEY, value BYTEA NOT NULL);
CREATE TABLE api_keys (
    key_id TEXT PRIMARY KEY, name TEXT NOT NULL, key_hash TEXT NOT NULL, models TEXT,
    created_at TIMESTAMPTZ NOT NULL, expires_at TIMESTAMPTZ, revoked_at TIMESTAMPTZ
);
CREATE UNIQUE INDEX api_keys_active_name ON api_keys (name) WHERE revoked_at IS NULL;
CREATE TABLE usage_daily (
    key_id TEXT NOT NULL, model TEXT NOT NULL, day DATE NOT NULL,
    requests BIGINT NOT NULL DEFAULT 0, prompt_tokens BIGINT NOT NULL DEFAULT 0,
    completion_tokens BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (key_id, model, day)
);
INSERT INTO secrets VALUES ('engine_master',
    '\\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff');
INSERT INTO api_keys VALUES ('0a1b2c3d', 'legacy', '{hash}', '["m1"]',
    '2025-01-02T03:04:05.000006+00:00', NULL, NULL);
INSERT INTO usage_daily VALUES ('0a1b2c3d', 'm1', '2025-01-02', 3, 30, 12);
"""
LEGACY_KEY = "llmgw-0a1b2c3d-" + "A" * 43
MASTER = bytes.fromhex("00112233445566778899aabbccddeeff" * 2)


async def _old_database(backend: Backend) -> None:
    script = _OLD_SQLITE if backend.name == "sqlite" else _OLD_POSTGRES
    await backend.execute_raw(
        script.replace("{hash}", hashlib.sha256(LEGACY_KEY.encode()).hexdigest())
    )


async def test_an_old_database_keeps_its_keys_usage_and_secret(backend: Backend) -> None:
    await _old_database(backend)
    store = await backend.open()  # init() upgrades
    (key,) = await store.list_keys()
    assert (key.key_id, key.name, key.models) == ("0a1b2c3d", "legacy", ["m1"])
    assert key.key_hash == hashlib.sha256(LEGACY_KEY.encode()).hexdigest()
    assert key.created_at == datetime(2025, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    # What the old schema could not say means what it always meant: no adapter list, no limits.
    assert key.adapters is None
    assert key.limits == KeyLimits()
    assert key.limits.isolate_cache is False
    assert (key.limits.weight, key.limits.top_priority) == (1.0, "interactive")
    # No key made before roles opens the remote console.
    assert key.admin is False
    (row,) = await store.usage()
    assert (row.day, row.requests, row.prompt_tokens, row.completion_tokens) == (
        date(2025, 1, 2),
        3,
        30,
        12,
    )
    assert await store.master_secret() == MASTER, "engines keyed before the upgrade still match"


async def test_an_upgraded_database_takes_the_new_fields(backend: Backend) -> None:
    await _old_database(backend)
    store = await backend.open()
    legacy = KeyLimits(rpm=5, token_budget=100, max_prompts_per_request=8)
    updated = await store.set_key_limits("legacy", legacy)
    assert updated is not None
    assert updated.limits == legacy
    limits = KeyLimits(
        tpm=7, max_choices_per_request=4, max_inflight_prompt_tokens=9_000, isolate_cache=True
    )
    record, _ = await store.create_key("fresh", adapters=["lora-a"], limits=limits)
    reopened = await backend.open()
    fresh = await reopened.get_key(record.key_id)
    assert fresh is not None
    assert (fresh.adapters, fresh.limits) == (["lora-a"], limits)


async def test_starts_racing_on_an_old_database_upgrade_it_once(backend: Backend) -> None:
    await _old_database(backend)
    # Several gateways starting at once: every init() must succeed, none adds a column twice.
    await asyncio.gather(*(backend.open() for _ in range(4)))
    store = await backend.open()
    assert [k.name for k in await store.list_keys()] == ["legacy"]


# The schema of the release before isolate_cache: today's, less that column.
_ISOLATE_COLUMN = ",\n    isolate_cache BOOLEAN NOT NULL DEFAULT FALSE"
_BEFORE_ISOLATION_ROW = """
INSERT INTO api_keys (key_id, name, key_hash, models, created_at, rpm, budget_period,
                      max_inflight_prompt_tokens)
VALUES ('0a1b2c3d', 'tenant', '{hash}', NULL, '2025-01-02T03:04:05.000006+00:00', 60, 'month',
        9000);
"""


async def test_a_database_from_before_cache_isolation_gains_it_switched_off(
    backend: Backend,
) -> None:
    schema = schema_for(SQLITE if backend.name == "sqlite" else POSTGRES)
    assert _ISOLATE_COLUMN in schema
    row = _BEFORE_ISOLATION_ROW.replace("{hash}", "0" * 64)
    await backend.execute_raw(schema.replace(_ISOLATE_COLUMN, "") + row)
    store = await backend.open()  # init() adds the column
    (key,) = await store.list_keys()
    assert key.limits == KeyLimits(rpm=60, budget_period="month", max_inflight_prompt_tokens=9000)
    assert key.limits.isolate_cache is False, "no key starts isolating on its own"
    updated = await store.set_key_limits(
        "tenant", key.limits.model_copy(update={"isolate_cache": True})
    )
    assert updated is not None
    reopened = await backend.open()
    again = await reopened.get_key("0a1b2c3d")
    assert again is not None
    assert again.limits.isolate_cache is True
    assert again.limits.rpm == 60


# The schema of the release before fair queuing: today's, less weight and top_priority.
_FAIRNESS_COLUMNS = (
    ",\n    weight DOUBLE PRECISION NOT NULL DEFAULT 1.0"
    ",\n    top_priority TEXT NOT NULL DEFAULT 'interactive'"
)
_BEFORE_FAIRNESS_ROW = """
INSERT INTO api_keys (key_id, name, key_hash, models, created_at, rpm, isolate_cache, admin)
VALUES ('0a1b2c3d', 'tenant', '{hash}', NULL, '2025-01-02T03:04:05.000006+00:00', 60, TRUE,
        TRUE);
"""


async def test_a_database_from_before_fair_queuing_gains_weight_1_and_interactive(
    backend: Backend,
) -> None:
    schema = schema_for(SQLITE if backend.name == "sqlite" else POSTGRES)
    assert _FAIRNESS_COLUMNS in schema
    row = _BEFORE_FAIRNESS_ROW.replace("{hash}", "0" * 64)
    await backend.execute_raw(schema.replace(_FAIRNESS_COLUMNS, "") + row)
    store = await backend.open()  # init() adds the columns
    (key,) = await store.list_keys()
    assert key.limits == KeyLimits(rpm=60, isolate_cache=True)
    assert (key.limits.weight, key.limits.top_priority) == (1.0, "interactive")
    assert key.admin is True
    updated = await store.set_key_limits(
        "tenant", key.limits.model_copy(update={"weight": 3.0, "top_priority": "critical"})
    )
    assert updated is not None
    reopened = await backend.open()
    again = await reopened.get_key("0a1b2c3d")
    assert again is not None
    assert again.limits == KeyLimits(
        rpm=60, isolate_cache=True, weight=3.0, top_priority="critical"
    )
    # A key made after the upgrade gets the same defaults from the model as the old one did
    # from the columns.
    fresh, _ = await reopened.create_key("fresh")
    assert (fresh.limits.weight, fresh.limits.top_priority) == (1.0, "interactive")


async def test_many_gateways_opening_one_file_in_rollback_mode_all_start(tmp_path: Path) -> None:
    """Switching a file to WAL takes an exclusive lock, and SQLite refuses it at once, without
    waiting, while another connection switches or writes. Before the switch was retried, 3 of
    240 such opens failed in one trial, and this test failed one run in three."""
    for round_ in range(40):
        path = tmp_path / f"{round_}.db"
        made = sqlite3.connect(path)
        made.executescript(_OLD_SQLITE.replace("{hash}", "0" * 64))
        made.close()
        stores = [SqliteStore(path) for _ in range(6)]
        await asyncio.gather(*(store.init() for store in stores))
        (key,) = await stores[0].list_keys()
        assert key.name == "legacy"
