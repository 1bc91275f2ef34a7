"""The PostgreSQL backend, through an asyncpg pool.

Tables land in the connection's search_path, so several llmgw installs (or test runs) can share
one database by naming a schema in the URL: `postgresql://...?search_path=llmgw`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, date, datetime
from typing import Any, cast

import asyncpg

from store import lease_round
from store.base import KEY_ID_ATTEMPTS, KeyNameTaken, Store
from store.dialect import POSTGRES
from store.dump_rules import check_dump, name_conflicts, write_order
from store.lease_rules import LeaseChange, LeaseState
from store.models import ApiKey, KeyLimits, StoreDump, UsageDelta, UsageRow
from store.queue_demand import Demand, DemandReport, demand_rows, reports
from store.records import (
    ADDED_KEY_COLUMNS,
    MASTER_SECRET_NAME,
    UPSTREAM_KEY_PREFIX,
    KeyDraft,
    key_from_row,
    key_values,
    limit_values,
    upstream_secret_name,
    usage_values,
)
from store.schema import schema
from store.statements import POSTGRES_STATEMENTS as sql
from store.validate import check_text, check_upstream_key, storable
from workflows.engine_keys import new_master_secret

# Two processes running CREATE TABLE IF NOT EXISTS at once can still collide in the catalog;
# an advisory lock around init makes concurrent starts safe.
_INIT_LOCK_ID = 0x6C6C6D6777
# Columns an existing api_keys table has, to add the missing ones (ADD COLUMN IF NOT EXISTS
# would do, but reading first keeps init from taking an exclusive lock when nothing changes).
KEY_COLUMNS_PRESENT = """
SELECT column_name FROM information_schema.columns
WHERE table_name = 'api_keys' AND table_schema = current_schema()
"""


def _same(value: Any) -> Any:
    # asyncpg takes datetimes and dates as they are.
    return value


def _key(row: Any) -> ApiKey:
    return key_from_row(row, _same)


def _usage(row: Any) -> UsageRow:
    return UsageRow(**dict(row))


async def _active_key_id(conn: Any, name_or_id: str) -> str | None:
    for query in sql.ACTIVE_KEY_ID_BY:
        key_id = await conn.fetchval(query, name_or_id)
        if key_id is not None:
            return cast(str, key_id)
    return None


async def _upgrade(conn: Any) -> None:
    present = {row["column_name"] for row in await conn.fetch(KEY_COLUMNS_PRESENT)}
    for column, sql_type in ADDED_KEY_COLUMNS:
        if column not in present:
            # Both names are constants from records.py, never input.
            await conn.execute(f"ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS {column} {sql_type}")


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
            await conn.execute(schema(POSTGRES))
            await _upgrade(conn)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def master_secret(self) -> bytes:
        if self._secret is None:
            pool = await self._get_pool()
            async with pool.acquire() as conn:
                await conn.execute(sql.SECRETS_ADD, MASTER_SECRET_NAME, new_master_secret())
                value = await conn.fetchval(sql.SECRETS_GET, MASTER_SECRET_NAME)
            self._secret = bytes(cast(bytes, value))
        return self._secret

    async def create_key(
        self,
        name: str,
        models: list[str] | None = None,
        expires_at: datetime | None = None,
        adapters: list[str] | None = None,
        limits: KeyLimits | None = None,
        admin: bool = False,
    ) -> tuple[ApiKey, str]:
        draft = KeyDraft(name, models, expires_at, adapters, limits, admin)
        pool = await self._get_pool()
        for _ in range(KEY_ID_ATTEMPTS):
            record, plaintext = draft.draw()
            try:
                await pool.execute(sql.INSERT_KEY, *key_values(record, _same))
            except asyncpg.UniqueViolationError as exc:
                if exc.constraint_name == "api_keys_active_name":
                    raise KeyNameTaken(name) from exc
                continue  # key_id collision: draw another
            return record, plaintext
        raise RuntimeError("could not find a free key_id")

    async def get_key(self, key_id: str) -> ApiKey | None:
        if not storable(key_id):
            return None
        pool = await self._get_pool()
        row = await pool.fetchrow(sql.SELECT_KEY, key_id)
        return None if row is None else _key(row)

    async def list_keys(self) -> list[ApiKey]:
        pool = await self._get_pool()
        return [_key(row) for row in await pool.fetch(sql.SELECT_KEYS_ORDERED)]

    async def revoke_key(self, name_or_id: str) -> bool:
        if not storable(name_or_id):
            return False
        pool = await self._get_pool()
        async with pool.acquire() as conn, conn.transaction():
            key_id = await _active_key_id(conn, name_or_id)
            if key_id is None:
                return False
            await conn.execute(sql.REVOKE, datetime.now(UTC), key_id)
            return True

    async def set_key_limits(self, name_or_id: str, limits: KeyLimits) -> ApiKey | None:
        limits = KeyLimits.model_validate(limits)
        if not storable(name_or_id):
            return None
        pool = await self._get_pool()
        async with pool.acquire() as conn, conn.transaction():
            key_id = await _active_key_id(conn, name_or_id)
            if key_id is None:
                return None
            await conn.execute(
                sql.SET_LIMITS,
                *limit_values(limits),
                key_id,
            )
            return _key(await conn.fetchrow(sql.SELECT_KEY, key_id))

    async def add_usage(self, rows: list[UsageDelta]) -> None:
        if not rows:
            return
        params = [usage_values(r, _same) for r in rows]
        pool = await self._get_pool()
        async with pool.acquire() as conn, conn.transaction():
            await conn.executemany(sql.ADD_USAGE, params)

    async def usage(
        self,
        key_id: str | None = None,
        model: str | None = None,
        since: date | None = None,
        until: date | None = None,
    ) -> list[UsageRow]:
        params = (
            None if key_id is None else check_text(key_id, "key_id"),
            None if model is None else check_text(model, "model"),
            since,
            until,
        )
        pool = await self._get_pool()
        return [_usage(row) for row in await pool.fetch(sql.SELECT_USAGE, *params)]

    async def spent_tokens(self, key_id: str, since: date) -> int:
        pool = await self._get_pool()
        # SUM of BIGINT is NUMERIC in PostgreSQL: it arrives as a Decimal.
        return int(await pool.fetchval(sql.SPENT_TOKENS, check_text(key_id, "key_id"), since))

    async def set_upstream_key(self, model: str, key: str | None) -> None:
        name = upstream_secret_name(model)
        pool = await self._get_pool()
        if key is None:
            await pool.execute(sql.SECRETS_DELETE, name)
        else:
            await pool.execute(sql.SECRETS_PUT, name, check_upstream_key(key).encode())

    async def upstream_keys(self) -> dict[str, str]:
        pool = await self._get_pool()
        return {
            row["name"].removeprefix(UPSTREAM_KEY_PREFIX): bytes(row["value"]).decode()
            for row in await pool.fetch(sql.SECRETS_ALL)
            if row["name"].startswith(UPSTREAM_KEY_PREFIX)
        }

    async def export_dump(self) -> StoreDump:
        pool = await self._get_pool()
        # One snapshot: a gateway flushing usage meanwhile lands wholly before or after.
        async with (
            pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            secrets = await conn.fetch(sql.SECRETS_ALL)
            keys = await conn.fetch(sql.SELECT_KEYS_ORDERED)
            usage = await conn.fetch(sql.SELECT_USAGE, None, None, None, None)
        return StoreDump(
            secrets={row["name"]: bytes(row["value"]) for row in secrets},
            keys=[_key(row) for row in keys],
            usage=[_usage(row) for row in usage],
        )

    async def import_dump(self, dump: StoreDump, replace_secrets: bool = True) -> None:
        check_dump(dump)
        pool = await self._get_pool()
        try:
            await self._import(pool, dump, replace_secrets)
        except asyncpg.UniqueViolationError as exc:
            # Only a hand-edited dump gets here (a key renamed onto another's name).
            raise ValueError(f"the dump's keys clash with the store's: {exc}") from None
        self._secret = None  # the master secret may have been replaced

    async def _import(self, pool: Any, dump: StoreDump, replace_secrets: bool) -> None:
        async with pool.acquire() as conn, conn.transaction():
            # Keeps another writer from taking a name between the check and the writes.
            await conn.execute("LOCK TABLE api_keys IN SHARE ROW EXCLUSIVE MODE")
            holders = {row["name"]: row["key_id"] for row in await conn.fetch(sql.ACTIVE_NAMES)}
            name_conflicts(dump, holders)
            secret_sql = sql.SECRETS_PUT if replace_secrets else sql.SECRETS_ADD
            await conn.executemany(secret_sql, list(dump.secrets.items()))
            await conn.executemany(
                sql.UPSERT_KEY, [key_values(k, _same) for k in write_order(dump.keys)]
            )
            await conn.executemany(sql.PUT_USAGE, [usage_values(r, _same) for r in dump.usage])

    async def sync_leases(
        self, holder: str, ttl_s: float, changes: Sequence[LeaseChange]
    ) -> list[LeaseState]:
        pool = await self._get_pool()
        async with pool.acquire() as conn, conn.transaction():
            now = float(await conn.fetchval(sql.NOW))
            steps = lease_round.sync_round(sql, holder, ttl_s, changes, now, _same)
            return await lease_round.run_async(conn, steps)

    async def lock_out(self, client: str, seconds: float) -> None:
        pool = await self._get_pool()
        async with pool.acquire() as conn, conn.transaction():
            now = float(await conn.fetchval(sql.NOW))
            await lease_round.run_async(conn, lease_round.lock_out(sql, client, seconds, now))

    async def lockouts(self) -> dict[str, float]:
        pool = await self._get_pool()
        async with pool.acquire() as conn:
            now = float(await conn.fetchval(sql.NOW))
            return await lease_round.run_async(conn, lease_round.lockouts(sql, now))

    async def publish_queue_demand(self, gateway: str, demand: Demand, keep_s: float) -> None:
        rows = demand_rows(gateway, demand)
        pool = await self._get_pool()
        async with pool.acquire() as conn, conn.transaction():
            now = float(await conn.fetchval(sql.NOW))
            await conn.execute(sql.DEMAND_DROP_OLD, now - keep_s)
            await conn.execute(sql.DEMAND_DROP_MINE, gateway)
            await conn.executemany(sql.DEMAND_PUT, [(gateway, m, text, now) for m, text in rows])

    async def queue_demands(self, within_s: float) -> list[DemandReport]:
        pool = await self._get_pool()
        async with pool.acquire() as conn:
            now = float(await conn.fetchval(sql.NOW))
            found = await conn.fetch(sql.DEMAND_FRESH, now - within_s)
        rows = [(r["gateway"], r["model"], r["demand"], float(r["updated_at"])) for r in found]
        return reports(rows, now)

    async def announce_peer(self, peer: str, address: str, keep_s: float) -> list[tuple[str, str]]:
        check_text(peer, "peer id")
        check_text(address, "peer address")
        pool = await self._get_pool()
        async with pool.acquire() as conn, conn.transaction():
            now = float(await conn.fetchval(sql.NOW))
            await conn.execute(sql.PEERS_DROP_OLD, now - keep_s)
            await conn.execute(sql.PEER_PUT, peer, address, now)
            found = await conn.fetch(sql.PEERS_FRESH, now - keep_s)
        return [(r["peer"], r["address"]) for r in found if r["peer"] != peer]

    async def withdraw_peer(self, peer: str) -> None:
        pool = await self._get_pool()
        async with pool.acquire() as conn:
            await conn.execute(sql.PEER_DROP, peer)
