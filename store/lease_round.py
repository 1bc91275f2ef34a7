"""One gateway's round with the shared limits (store/lease_rules.py), and the auth lockouts,
written once for both backends.

SQLite runs a round synchronously, on its worker thread, inside BEGIN IMMEDIATE (which holds
the file's write lock); PostgreSQL awaits each statement, inside a transaction whose pool rows
are locked (SELECT ... FOR UPDATE) while their leases change. So the round is a generator of
`Step`s: each backend's driver (`run_sync`, `run_async`) sends every statement and hands the
result back in. Pools are taken in one order, so two gateways' rounds never deadlock; every
lease is renewed last, after the pools.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any, Literal, TypeVar

from store.lease_rules import LeaseChange, LeaseState, PoolRef, PoolRow, apply_change
from store.records import LEASED_LIMIT_COLUMNS
from store.statements import Statements

T = TypeVar("T")
# Lockouts that ended this long ago are deleted when a new one is written.
LOCKOUT_KEEP_S = 3600.0


@dataclass(frozen=True, slots=True)
class Step:
    """One statement of a round: `one` row (or None), `all` rows, or `run` for its effect."""

    want: Literal["one", "all", "run"]
    sql: str
    args: tuple[Any, ...] = ()


Steps = Generator[Step, Any, T]


def key_limit(row: Any, pool: PoolRef) -> int | None:
    """The key's limit for the pool's kind from its KEY_LIMITS row: 0 for a revoked or unknown
    key (nothing is granted), None when the key has no such limit."""
    if row is None or row["revoked_at"] is not None:
        return 0
    value = row[LEASED_LIMIT_COLUMNS[pool.kind]]
    return None if value is None else int(value)


def _order(change: LeaseChange) -> tuple[str, str, str]:
    return change.pool.key_id, change.pool.kind, change.pool.period


def sync_round(
    sql: Statements,
    holder: str,
    ttl_s: float,
    changes: Sequence[LeaseChange],
    now: float,
    day: Callable[[date], Any],
) -> Steps[list[LeaseState]]:
    """Each change applied to its pool (expired leases of that pool reclaimed first), then
    every lease of `holder` renewed; states in the order of `changes`. `now`: the store's
    clock; `day`: a date as the backend's parameter."""
    states: dict[int, LeaseState] = {}
    # sorted() is stable: two changes to one pool still apply in the order they were given.
    for index, change in sorted(enumerate(changes), key=lambda item: _order(item[1])):
        pool = change.pool
        ident = (pool.key_id, pool.kind, pool.period)
        limit = key_limit((yield Step("one", sql.KEY_LIMITS, (pool.key_id,))), pool)
        found = yield Step("one", sql.POOL_GET, ident)
        if found is None:
            seed = 0
            if pool.kind == "budget":
                # A new period's pool starts from what the usage table already holds for it.
                since = day(date.fromisoformat(pool.period))
                spent = yield Step("one", sql.SPENT_TOKENS, (pool.key_id, since))
                seed = int(spent[0])
            yield Step("run", sql.POOL_CREATE, (*ident, seed))
            found = yield Step("one", sql.POOL_GET, ident)
        row = PoolRow(int(found["spent"]), int(found["leased"]))
        if sql.dialect.delete_returning:
            reaped = yield Step("all", sql.POOL_REAP_RETURNING, (*ident, now))
            row.leased -= sum(int(r["held"]) for r in reaped)
        else:
            expired = int((yield Step("one", sql.POOL_EXPIRED, (*ident, now)))[0])
            if expired:
                yield Step("run", sql.POOL_REAP, (*ident, now))
                row.leased -= expired
        lease = yield Step("one", sql.LEASE_GET, (*ident, holder))
        held, state = apply_change(row, 0 if lease is None else int(lease["held"]), limit, change)
        yield Step("run", sql.POOL_PUT, (row.spent, row.leased, *ident))
        if held > 0:
            yield Step("run", sql.LEASE_PUT, (*ident, holder, held, now + ttl_s))
        else:
            yield Step("run", sql.LEASE_DROP, (*ident, holder))
        states[index] = state
    yield Step("run", sql.LEASES_RENEW, (now + ttl_s, holder))
    return [states[i] for i in range(len(changes))]


def lock_out(sql: Statements, client: str, seconds: float, now: float) -> Steps[None]:
    yield Step("run", sql.LOCKOUTS_FORGET, (now - LOCKOUT_KEEP_S,))
    yield Step("run", sql.LOCKOUT_PUT, (client, now + seconds))


def lockouts(sql: Statements, now: float) -> Steps[dict[str, float]]:
    rows = yield Step("all", sql.LOCKOUTS_ACTIVE, (now,))
    return {str(row["client"]): float(row["locked_until"]) - now for row in rows}


def run_sync(conn: sqlite3.Connection, steps: Steps[T]) -> T:
    """Run a round on a sqlite3 connection, in the caller's transaction."""
    result: Any = None
    while True:
        try:
            step = steps.send(result)
        except StopIteration as done:
            value: T = done.value
            return value
        cursor = conn.execute(step.sql, step.args)
        if step.want == "one":
            result = cursor.fetchone()
        elif step.want == "all":
            result = cursor.fetchall()
        else:
            result = None
        cursor.close()


async def run_async(conn: Any, steps: Steps[T]) -> T:
    """Run a round on an asyncpg connection, in the caller's transaction."""
    result: Any = None
    while True:
        try:
            step = steps.send(result)
        except StopIteration as done:
            value: T = done.value
            return value
        if step.want == "one":
            result = await conn.fetchrow(step.sql, *step.args)
        elif step.want == "all":
            result = await conn.fetch(step.sql, *step.args)
        else:
            result = await conn.execute(step.sql, *step.args)
