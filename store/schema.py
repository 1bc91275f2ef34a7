"""The store's tables, written once for both backends (store/dialect.py renders the types).

Every statement is idempotent, so `init()` runs them all on every start. A table's definition
here is what databases already hold: a column an older release lacked goes in
records.ADDED_KEY_COLUMNS (api_keys) so `init()` adds it there too, never into a CREATE TABLE
alone.
"""

from __future__ import annotations

from store.dialect import Dialect
from store.records import ADDED_KEY_COLUMNS

# The first release's api_keys, then each column added since, in the order records.py adds
# them to an older table: a fresh table and an upgraded one look alike.
_API_KEYS = (
    """
CREATE TABLE IF NOT EXISTS api_keys (
    key_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    key_hash TEXT NOT NULL,
    models TEXT,
    created_at {timestamp} NOT NULL,
    expires_at {timestamp},
    revoked_at {timestamp}"""
    + "".join(f",\n    {column} {sql_type}" for column, sql_type in ADDED_KEY_COLUMNS)
    + """
);
CREATE UNIQUE INDEX IF NOT EXISTS api_keys_active_name
    ON api_keys (name) WHERE revoked_at IS NULL;
"""
)

_KEYS_AND_USAGE = (
    """
CREATE TABLE IF NOT EXISTS secrets (
    name TEXT PRIMARY KEY,
    value {bytes} NOT NULL
);"""
    + _API_KEYS
    + """CREATE TABLE IF NOT EXISTS usage_daily (
    key_id TEXT NOT NULL,
    model TEXT NOT NULL,
    day {day} NOT NULL,
    requests {count} NOT NULL DEFAULT 0,
    prompt_tokens {count} NOT NULL DEFAULT 0,
    completion_tokens {count} NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, model, day)
);
"""
)

# Shared limits (store/lease_rules.py): one pool per key and limit, one lease per pool and
# gateway. Times are Unix seconds, by the database's clock on PostgreSQL (gateways on several
# hosts agree on when a lease expires) and by the one host's on SQLite.
_LEASES = """
CREATE TABLE IF NOT EXISTS quota_pools (
    key_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    period TEXT NOT NULL,
    spent {count} NOT NULL DEFAULT 0,
    leased {count} NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, kind, period)
);
CREATE TABLE IF NOT EXISTS quota_leases (
    key_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    period TEXT NOT NULL,
    holder TEXT NOT NULL,
    held {count} NOT NULL,
    expires_at {seconds} NOT NULL,
    PRIMARY KEY (key_id, kind, period, holder)
);
CREATE INDEX IF NOT EXISTS quota_leases_holder ON quota_leases (holder);
CREATE TABLE IF NOT EXISTS auth_lockouts (
    client TEXT PRIMARY KEY,
    locked_until {seconds} NOT NULL
);
"""

# The fair queue's demand, per gateway and model (store/queue_demand.py). Unix seconds.
_QUEUE_DEMAND = """
CREATE TABLE IF NOT EXISTS queue_demand (
    gateway TEXT NOT NULL,
    model TEXT NOT NULL,
    demand TEXT NOT NULL,
    updated_at {seconds} NOT NULL,
    PRIMARY KEY (gateway, model)
);
"""

# Where each gateway process's peer bus listens (gateway/peers/): one row a process, rewritten
# every round. Unix seconds.
_PEERS = """
CREATE TABLE IF NOT EXISTS gateway_peers (
    peer TEXT PRIMARY KEY,
    address TEXT NOT NULL,
    seen_at {seconds} NOT NULL
);
"""

TABLES = _KEYS_AND_USAGE + _LEASES + _QUEUE_DEMAND + _PEERS


def schema(dialect: Dialect) -> str:
    """Every table and index, as one script for `dialect`."""
    return dialect.render(TABLES)
