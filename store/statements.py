"""Every statement the key store sends, each written once for both backends.

Written with `?` placeholders and store/dialect.py's markers; `Statements(dialect)` holds them
rendered for one backend, under the same names. All are constants: values travel only as
parameters. Statements that list a key's columns are made from records.KEY_COLUMNS, so a new
column is named in one place, and their values come in that order (records.key_values).

A few statements only one backend sends, each saying why.
"""

from __future__ import annotations

from store.dialect import POSTGRES, SQLITE, Dialect
from store.records import KEY_COLUMNS, LEASED_LIMIT_COLUMNS, LIMIT_COLUMNS

_KEY_LIST = ", ".join(KEY_COLUMNS)
_KEY_MARKS = ", ".join("?" * len(KEY_COLUMNS))


class Statements:
    """The statements as written; an instance holds them rendered for one dialect."""

    dialect: Dialect

    # PostgreSQL only: the database's clock in Unix seconds, so gateways on several hosts agree
    # on when a lease or a row expires. SQLite's is the host's (time.time()): every process
    # sharing the file runs on it.
    NOW = "SELECT extract(epoch FROM clock_timestamp())::float8"

    SECRETS_ALL = "SELECT name, value FROM secrets ORDER BY name"
    SECRETS_GET = "SELECT value FROM secrets WHERE name = ?"
    SECRETS_ADD = "INSERT INTO secrets (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING"
    SECRETS_PUT = """
INSERT INTO secrets (name, value) VALUES (?, ?)
ON CONFLICT (name) DO UPDATE SET value = excluded.value
"""
    SECRETS_DELETE = "DELETE FROM secrets WHERE name = ?"

    # The generated statements below name columns from records.py, never input (S608).
    SELECT_KEYS = f"SELECT {_KEY_LIST} FROM api_keys"  # noqa: S608
    SELECT_KEYS_ORDERED = SELECT_KEYS + " ORDER BY created_at, key_id"
    SELECT_KEY = SELECT_KEYS + " WHERE key_id = ?"
    ACTIVE_NAMES = "SELECT name, key_id FROM api_keys WHERE revoked_at IS NULL"
    # key_id first: it is exact, while a name could in theory look like an id. The row stays
    # locked until the change that follows commits.
    ACTIVE_KEY_ID_BY = (
        "SELECT key_id FROM api_keys WHERE key_id = ? AND revoked_at IS NULL{for_update}",
        "SELECT key_id FROM api_keys WHERE name = ? AND revoked_at IS NULL{for_update}",
    )
    # SQLite only: it checks before inserting; PostgreSQL tells the two apart by the
    # constraint an insert breaks.
    KEY_ID_EXISTS = "SELECT 1 FROM api_keys WHERE key_id = ?"
    NAME_TAKEN = "SELECT 1 FROM api_keys WHERE name = ? AND revoked_at IS NULL"
    INSERT_KEY = f"INSERT INTO api_keys ({_KEY_LIST}) VALUES ({_KEY_MARKS})"  # noqa: S608
    UPSERT_KEY = (
        INSERT_KEY
        + " ON CONFLICT (key_id) DO UPDATE SET "
        + ", ".join(f"{column} = excluded.{column}" for column in KEY_COLUMNS[1:])
    )
    REVOKE = "UPDATE api_keys SET revoked_at = ? WHERE key_id = ?"
    # Values in records.LIMIT_COLUMNS order, then the key_id.
    SET_LIMITS = (
        "UPDATE api_keys SET "  # noqa: S608 - column names, never input
        + ", ".join(f"{column} = ?" for column in LIMIT_COLUMNS)
        + " WHERE key_id = ?"
    )

    ADD_USAGE = """
INSERT INTO usage_daily AS u (key_id, model, day, requests, prompt_tokens, completion_tokens)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (key_id, model, day) DO UPDATE SET
    requests = u.requests + excluded.requests,
    prompt_tokens = u.prompt_tokens + excluded.prompt_tokens,
    completion_tokens = u.completion_tokens + excluded.completion_tokens
"""
    # An import sets the totals rather than adding to them, so importing twice changes nothing.
    PUT_USAGE = """
INSERT INTO usage_daily (key_id, model, day, requests, prompt_tokens, completion_tokens)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (key_id, model, day) DO UPDATE SET
    requests = excluded.requests,
    prompt_tokens = excluded.prompt_tokens,
    completion_tokens = excluded.completion_tokens
"""
    # One static statement with optional filters. The casts give PostgreSQL each parameter's
    # type where it is compared with NULL; in SQLite they change nothing.
    SELECT_USAGE = """
SELECT key_id, model, day, requests, prompt_tokens, completion_tokens FROM usage_daily
WHERE (CAST(?1 AS TEXT) IS NULL OR key_id = ?1) AND (CAST(?2 AS TEXT) IS NULL OR model = ?2)
  AND (CAST(?3 AS {day}) IS NULL OR day >= ?3) AND (CAST(?4 AS {day}) IS NULL OR day <= ?4)
ORDER BY day, key_id, model
"""
    SPENT_TOKENS = """
SELECT COALESCE(SUM(prompt_tokens + completion_tokens), 0) FROM usage_daily
WHERE key_id = ? AND day >= ?
"""

    # Shared limits (store/lease_rules.py).
    KEY_LIMITS = (
        "SELECT "  # noqa: S608 - column names, never input
        + ", ".join(LEASED_LIMIT_COLUMNS.values())
        + ", revoked_at FROM api_keys WHERE key_id = ?"
    )
    POOL_CREATE = """
INSERT INTO quota_pools (key_id, kind, period, spent, leased) VALUES (?, ?, ?, ?, 0)
ON CONFLICT (key_id, kind, period) DO NOTHING
"""
    # On PostgreSQL the pool's row lock serialises every change to the pool and its leases.
    POOL_GET = """
SELECT spent, leased FROM quota_pools WHERE key_id = ? AND kind = ? AND period = ?{for_update}
"""
    POOL_PUT = """
UPDATE quota_pools SET spent = ?, leased = ? WHERE key_id = ? AND kind = ? AND period = ?
"""
    POOL_REAP = """
DELETE FROM quota_leases WHERE key_id = ? AND kind = ? AND period = ? AND expires_at < ?
"""
    # Where the dialect has DELETE ... RETURNING, reaping counts what it frees; else the count
    # is read first (POOL_EXPIRED).
    POOL_REAP_RETURNING = POOL_REAP.rstrip() + " RETURNING held"
    POOL_EXPIRED = """
SELECT COALESCE(SUM(held), 0) FROM quota_leases
WHERE key_id = ? AND kind = ? AND period = ? AND expires_at < ?
"""
    LEASE_GET = """
SELECT held FROM quota_leases WHERE key_id = ? AND kind = ? AND period = ? AND holder = ?
"""
    LEASE_PUT = """
INSERT INTO quota_leases (key_id, kind, period, holder, held, expires_at)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (key_id, kind, period, holder) DO UPDATE SET
    held = excluded.held, expires_at = excluded.expires_at
"""
    LEASE_DROP = """
DELETE FROM quota_leases WHERE key_id = ? AND kind = ? AND period = ? AND holder = ?
"""
    LEASES_RENEW = "UPDATE quota_leases SET expires_at = ? WHERE holder = ?"
    # A longer lockout already there is kept.
    LOCKOUT_PUT = """
INSERT INTO auth_lockouts AS l (client, locked_until) VALUES (?, ?)
ON CONFLICT (client) DO UPDATE SET locked_until = excluded.locked_until
WHERE excluded.locked_until > l.locked_until
"""
    LOCKOUTS_FORGET = "DELETE FROM auth_lockouts WHERE locked_until < ?"
    LOCKOUTS_ACTIVE = "SELECT client, locked_until FROM auth_lockouts WHERE locked_until > ?"

    # The fair queue's demand (store/queue_demand.py).
    DEMAND_DROP_MINE = "DELETE FROM queue_demand WHERE gateway = ?"
    DEMAND_DROP_OLD = """
DELETE FROM queue_demand WHERE (gateway, model) IN (
    SELECT gateway, model FROM queue_demand WHERE updated_at < ?{skip_locked}
)
"""
    DEMAND_PUT = "INSERT INTO queue_demand (gateway, model, demand, updated_at) VALUES (?, ?, ?, ?)"
    DEMAND_FRESH = (
        "SELECT gateway, model, demand, updated_at FROM queue_demand WHERE updated_at >= ?"
    )

    # The gateways' peer bus (gateway/peers/).
    PEER_PUT = """
INSERT INTO gateway_peers (peer, address, seen_at) VALUES (?, ?, ?)
ON CONFLICT (peer) DO UPDATE SET address = excluded.address, seen_at = excluded.seen_at
"""
    PEER_DROP = "DELETE FROM gateway_peers WHERE peer = ?"
    PEERS_DROP_OLD = """
DELETE FROM gateway_peers WHERE peer IN (
    SELECT peer FROM gateway_peers WHERE seen_at < ?{skip_locked}
)
"""
    PEERS_FRESH = "SELECT peer, address FROM gateway_peers WHERE seen_at >= ? ORDER BY peer"

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        for name, written in vars(Statements).items():
            if not name.isupper():
                continue
            if isinstance(written, tuple):
                setattr(self, name, tuple(dialect.render(text) for text in written))
            else:
                setattr(self, name, dialect.render(written))


SQLITE_STATEMENTS = Statements(SQLITE)
POSTGRES_STATEMENTS = Statements(POSTGRES)
