"""The PostgreSQL backend's shared limits: one transaction per gateway round, each pool's row
locked (SELECT ... FOR UPDATE) while its leases change. Pools are locked in one order, so two
gateways' rounds never deadlock; every lease is renewed last, after the pools."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from typing import Any

from store.lease_rules import LeaseChange, LeaseState, PoolRef, PoolRow, apply_change
from store.records import LEASED_LIMIT_COLUMNS
from store.statements import POSTGRES_STATEMENTS as sql

LOCKOUT_KEEP_S = 3600.0


async def key_limit(conn: Any, pool: PoolRef) -> int | None:
    """0 for a revoked or unknown key, None when the key has no such limit."""
    row = await conn.fetchrow(sql.KEY_LIMITS, pool.key_id)
    if row is None or row["revoked_at"] is not None:
        return 0
    value = row[LEASED_LIMIT_COLUMNS[pool.kind]]
    return None if value is None else int(value)


def _order(change: LeaseChange) -> tuple[str, str, str]:
    return change.pool.key_id, change.pool.kind, change.pool.period


async def sync_leases(
    conn: Any, holder: str, ttl_s: float, changes: Sequence[LeaseChange]
) -> list[LeaseState]:
    now = float(await conn.fetchval(sql.NOW))
    states: dict[int, LeaseState] = {}
    for index, change in sorted(enumerate(changes), key=lambda item: _order(item[1])):
        pool = change.pool
        ident = (pool.key_id, pool.kind, pool.period)
        limit = await key_limit(conn, pool)
        found = await conn.fetchrow(sql.POOL_GET, *ident)
        if found is None:
            seed = 0
            if pool.kind == "budget":
                # A new period's pool starts from what the usage table already holds for it.
                since = date.fromisoformat(pool.period)
                seed = int(await conn.fetchval(sql.SPENT_TOKENS, pool.key_id, since))
            await conn.execute(sql.POOL_CREATE, *ident, seed)
            found = await conn.fetchrow(sql.POOL_GET, *ident)
        row = PoolRow(int(found["spent"]), int(found["leased"]))
        reaped = await conn.fetch(sql.POOL_REAP_RETURNING, *ident, now)
        row.leased -= sum(int(r["held"]) for r in reaped)
        lease = await conn.fetchval(sql.LEASE_GET, *ident, holder)
        held, state = apply_change(row, 0 if lease is None else int(lease), limit, change)
        await conn.execute(sql.POOL_PUT, row.spent, row.leased, *ident)
        if held > 0:
            await conn.execute(sql.LEASE_PUT, *ident, holder, held, now + ttl_s)
        else:
            await conn.execute(sql.LEASE_DROP, *ident, holder)
        states[index] = state
    await conn.execute(sql.LEASES_RENEW, now + ttl_s, holder)
    return [states[i] for i in range(len(changes))]


async def lock_out(conn: Any, client: str, seconds: float) -> None:
    now = float(await conn.fetchval(sql.NOW))
    await conn.execute(sql.LOCKOUTS_FORGET, now - LOCKOUT_KEEP_S)
    await conn.execute(sql.LOCKOUT_PUT, client, now + seconds)


async def lockouts(conn: Any) -> dict[str, float]:
    now = float(await conn.fetchval(sql.NOW))
    rows = await conn.fetch(sql.LOCKOUTS_ACTIVE, now)
    return {str(row["client"]): float(row["locked_until"]) - now for row in rows}
