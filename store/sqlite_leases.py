"""The SQLite backend's shared limits: each call runs inside the store's BEGIN IMMEDIATE
transaction, which holds the database's write lock, so a pool and its leases change for one
gateway at a time, whichever process it runs in."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import date

from store.lease_rules import LeaseChange, LeaseState, PoolRef, PoolRow, apply_change
from store.records import LEASED_LIMIT_COLUMNS
from store.statements import SQLITE_STATEMENTS as sql

# Lockouts that ended this long ago are deleted when a new one is written.
LOCKOUT_KEEP_S = 3600.0


def key_limit(conn: sqlite3.Connection, pool: PoolRef) -> int | None:
    """The key's limit for the pool's kind: 0 for a revoked or unknown key (nothing is
    granted), None when the key has no such limit."""
    row = conn.execute(sql.KEY_LIMITS, (pool.key_id,)).fetchone()
    if row is None or row["revoked_at"] is not None:
        return 0
    value = row[LEASED_LIMIT_COLUMNS[pool.kind]]
    return None if value is None else int(value)


def sync_leases(
    conn: sqlite3.Connection,
    holder: str,
    ttl_s: float,
    changes: Sequence[LeaseChange],
    now: float,
) -> list[LeaseState]:
    states = []
    for change in changes:
        pool = change.pool
        ident = (pool.key_id, pool.kind, pool.period)
        limit = key_limit(conn, pool)
        seed = 0
        if pool.kind == "budget" and conn.execute(sql.POOL_GET, ident).fetchone() is None:
            # A new period's pool starts from what the usage table already holds for it.
            since = date.fromisoformat(pool.period).isoformat()
            seed = int(conn.execute(sql.SPENT_TOKENS, (pool.key_id, since)).fetchone()[0])
        conn.execute(sql.POOL_CREATE, (*ident, seed))
        found = conn.execute(sql.POOL_GET, ident).fetchone()
        row = PoolRow(int(found["spent"]), int(found["leased"]))
        expired = int(conn.execute(sql.POOL_EXPIRED, (*ident, now)).fetchone()[0])
        if expired:
            conn.execute(sql.POOL_REAP, (*ident, now))
            row.leased -= expired
        lease = conn.execute(sql.LEASE_GET, (*ident, holder)).fetchone()
        held, state = apply_change(row, 0 if lease is None else int(lease["held"]), limit, change)
        conn.execute(sql.POOL_PUT, (row.spent, row.leased, *ident))
        if held > 0:
            conn.execute(sql.LEASE_PUT, (*ident, holder, held, now + ttl_s))
        else:
            conn.execute(sql.LEASE_DROP, (*ident, holder))
        states.append(state)
    conn.execute(sql.LEASES_RENEW, (now + ttl_s, holder))
    return states


def lock_out(conn: sqlite3.Connection, client: str, seconds: float, now: float) -> None:
    conn.execute(sql.LOCKOUTS_FORGET, (now - LOCKOUT_KEEP_S,))
    conn.execute(sql.LOCKOUT_PUT, (client, now + seconds))


def lockouts(conn: sqlite3.Connection, now: float) -> dict[str, float]:
    rows = conn.execute(sql.LOCKOUTS_ACTIVE, (now,)).fetchall()
    return {str(row["client"]): float(row["locked_until"]) - now for row in rows}
