"""The PostgreSQL backend, through an asyncpg pool.

Tables land in the connection's search_path, so several llmgw installs (or test runs) can share
one database by naming a schema in the URL: `postgresql://...?search_path=llmgw`.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from typing import Any, cast

import asyncpg

from gateway.store.base import KEY_ID_ATTEMPTS, MASTER_SECRET_NAME, KeyNameTaken, Store
from gateway.store.keyformat import hash_api_key, new_api_key, new_key_id
from gateway.store.models import ApiKey, UsageDelta, UsageRow
from gateway.store.validate import check_key_name, check_models, utc
from workflows.engine_keys import new_master_secret

_SCHEMA = """
CREATE TABLE IF NOT EXISTS secrets (
    name TEXT PRIMARY KEY,
    value BYTEA NOT NULL
);
CREATE TABLE IF NOT EXISTS api_keys (
    key_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    key_hash TEXT NOT NULL,
    models TEXT,
    created_at TIMESTAMPTZ NOT NULL,
    expires_at TIMESTAMPTZ,
    revoked_at TIMESTAMPTZ
);
CREATE UNIQUE INDEX IF NOT EXISTS api_keys_active_name
    ON api_keys (name) WHERE revoked_at IS NULL;
CREATE TABLE IF NOT EXISTS usage_daily (
    key_id TEXT NOT NULL,
    model TEXT NOT NULL,
    day DATE NOT NULL,
    requests BIGINT NOT NULL DEFAULT 0,
    prompt_tokens BIGINT NOT NULL DEFAULT 0,
    completion_tokens BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, model, day)
);
"""

_SELECT_KEYS = (
    "SELECT key_id, name, key_hash, models, created_at, expires_at, revoked_at FROM api_keys"
)
_INSERT_KEY = (
    "INSERT INTO api_keys (key_id, name, key_hash, models, created_at, expires_at, revoked_at) "
    "VALUES ($1, $2, $3, $4, $5, $6, NULL)"
)
# key_id first: it is exact, while a name could in theory look like an id.
_REVOKE_BY = (
    "UPDATE api_keys SET revoked_at = $1 WHERE key_id = $2 AND revoked_at IS NULL",
    "UPDATE api_keys SET revoked_at = $1 WHERE name = $2 AND revoked_at IS NULL",
)
# One static statement with optional filters: no SQL is ever assembled from strings.
_SELECT_USAGE = """
SELECT key_id, model, day, requests, prompt_tokens, completion_tokens FROM usage_daily
WHERE ($1::text IS NULL OR key_id = $1) AND ($2::text IS NULL OR model = $2)
  AND ($3::date IS NULL OR day >= $3)
ORDER BY day, key_id, model
"""
# Two processes running CREATE TABLE IF NOT EXISTS at once can still collide in the catalog;
# an advisory lock around init makes concurrent starts safe.
_INIT_LOCK_ID = 0x6C6C6D6777


def _key_from_record(row: Any) -> ApiKey:
    return ApiKey(
        key_id=row["key_id"],
        name=row["name"],
        key_hash=row["key_hash"],
        models=None if row["models"] is None else json.loads(row["models"]),
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        revoked_at=row["revoked_at"],
    )


class PostgresStore(Store):
    def __init__(self, url: str) -> None:
        self._url = url
        self._pool: Any = None
        self._secret: bytes | None = None

    async def _get_pool(self) -> Any:
        if self._pool is None:
            self._pool = await asyncpg.create_pool(self._url, min_size=1, max_size=8)
        return self._pool

    async def init(self) -> None:
        pool = await self._get_pool()
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _INIT_LOCK_ID)
            await conn.execute(_SCHEMA)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def master_secret(self) -> bytes:
        if self._secret is None:
            pool = await self._get_pool()
            async with pool.acquire() as conn:
                await conn.execute(
                    "INSERT INTO secrets (name, value) VALUES ($1, $2) "
                    "ON CONFLICT (name) DO NOTHING",
                    MASTER_SECRET_NAME,
                    new_master_secret(),
                )
                value = await conn.fetchval(
                    "SELECT value FROM secrets WHERE name = $1", MASTER_SECRET_NAME
                )
            self._secret = bytes(cast(bytes, value))
        return self._secret

    async def create_key(
        self, name: str, models: list[str] | None = None, expires_at: datetime | None = None
    ) -> tuple[ApiKey, str]:
        check_key_name(name)
        models = check_models(models)
        expires_at = utc(expires_at)
        created_at = datetime.now(UTC)
        pool = await self._get_pool()
        for _ in range(KEY_ID_ATTEMPTS):
            key_id = new_key_id()
            plaintext = new_api_key(key_id)
            record = ApiKey(
                key_id=key_id,
                name=name,
                key_hash=hash_api_key(plaintext),
                models=models,
                created_at=created_at,
                expires_at=expires_at,
            )
            try:
                await pool.execute(
                    _INSERT_KEY,
                    record.key_id,
                    record.name,
                    record.key_hash,
                    None if models is None else json.dumps(models),
                    record.created_at,
                    record.expires_at,
                )
            except asyncpg.UniqueViolationError as exc:
                if exc.constraint_name == "api_keys_active_name":
                    raise KeyNameTaken(name) from exc
                continue  # key_id collision: draw another
            return record, plaintext
        raise RuntimeError("could not find a free key_id")

    async def get_key(self, key_id: str) -> ApiKey | None:
        pool = await self._get_pool()
        row = await pool.fetchrow(_SELECT_KEYS + " WHERE key_id = $1", key_id)
        return None if row is None else _key_from_record(row)

    async def list_keys(self) -> list[ApiKey]:
        pool = await self._get_pool()
        rows = await pool.fetch(_SELECT_KEYS + " ORDER BY created_at, key_id")
        return [_key_from_record(row) for row in rows]

    async def revoke_key(self, name_or_id: str) -> bool:
        pool = await self._get_pool()
        now = datetime.now(UTC)
        async with pool.acquire() as conn, conn.transaction():
            for query in _REVOKE_BY:
                status = await conn.execute(query, now, name_or_id)
                if cast(str, status) != "UPDATE 0":
                    return True
        return False

    async def add_usage(self, rows: list[UsageDelta]) -> None:
        if not rows:
            return
        pool = await self._get_pool()
        async with pool.acquire() as conn, conn.transaction():
            await conn.executemany(
                """
                INSERT INTO usage_daily AS u
                    (key_id, model, day, requests, prompt_tokens, completion_tokens)
                VALUES ($1, $2, $3, $4, $5, $6)
                ON CONFLICT (key_id, model, day) DO UPDATE SET
                    requests = u.requests + excluded.requests,
                    prompt_tokens = u.prompt_tokens + excluded.prompt_tokens,
                    completion_tokens = u.completion_tokens + excluded.completion_tokens
                """,
                [
                    (r.key_id, r.model, r.day, r.requests, r.prompt_tokens, r.completion_tokens)
                    for r in rows
                ],
            )

    async def usage(
        self, key_id: str | None = None, model: str | None = None, since: date | None = None
    ) -> list[UsageRow]:
        pool = await self._get_pool()
        rows = await pool.fetch(_SELECT_USAGE, key_id, model, since)
        return [UsageRow(**dict(row)) for row in rows]
