"""The SQLite backend's schema and statements. All are literal constants: values travel only as
parameters. Key columns are always listed in records.KEY_COLUMNS order, usage columns in
records.USAGE_COLUMNS order."""

# The key columns after revoked_at are the ones records.ADDED_KEY_COLUMNS adds to an older
# table, in the same order, so a fresh table and an upgraded one look alike.
SCHEMA = """
CREATE TABLE IF NOT EXISTS secrets (
    name TEXT PRIMARY KEY,
    value BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS api_keys (
    key_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    key_hash TEXT NOT NULL,
    models TEXT,
    created_at TEXT NOT NULL,
    expires_at TEXT,
    revoked_at TEXT,
    adapters TEXT,
    rpm BIGINT,
    tpm BIGINT,
    token_budget BIGINT,
    budget_period TEXT NOT NULL DEFAULT 'day',
    max_prompts_per_request BIGINT,
    max_choices_per_request BIGINT,
    max_prompt_tokens_per_request BIGINT,
    max_inflight_prompt_tokens BIGINT,
    isolate_cache BOOLEAN NOT NULL DEFAULT FALSE,
    admin BOOLEAN NOT NULL DEFAULT FALSE,
    weight DOUBLE PRECISION NOT NULL DEFAULT 1.0,
    top_priority TEXT NOT NULL DEFAULT 'interactive'
);
CREATE UNIQUE INDEX IF NOT EXISTS api_keys_active_name
    ON api_keys (name) WHERE revoked_at IS NULL;
CREATE TABLE IF NOT EXISTS usage_daily (
    key_id TEXT NOT NULL,
    model TEXT NOT NULL,
    day TEXT NOT NULL,
    requests INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, model, day)
);
"""

SECRETS_ALL = "SELECT name, value FROM secrets ORDER BY name"
SECRETS_GET = "SELECT value FROM secrets WHERE name = ?"
SECRETS_ADD = "INSERT INTO secrets (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING"
SECRETS_PUT = """
INSERT INTO secrets (name, value) VALUES (?, ?)
ON CONFLICT (name) DO UPDATE SET value = excluded.value
"""
SECRETS_DELETE = "DELETE FROM secrets WHERE name = ?"

SELECT_KEYS = """
SELECT key_id, name, key_hash, models, adapters, rpm, tpm, token_budget, budget_period,
       max_prompts_per_request, max_choices_per_request, max_prompt_tokens_per_request,
       max_inflight_prompt_tokens, isolate_cache, weight, top_priority, created_at, expires_at,
       revoked_at, admin
FROM api_keys
"""
SELECT_KEYS_ORDERED = SELECT_KEYS + " ORDER BY created_at, key_id"
SELECT_KEY = SELECT_KEYS + " WHERE key_id = ?"
KEY_ID_EXISTS = "SELECT 1 FROM api_keys WHERE key_id = ?"
ACTIVE_NAMES = "SELECT name, key_id FROM api_keys WHERE revoked_at IS NULL"
NAME_TAKEN = "SELECT 1 FROM api_keys WHERE name = ? AND revoked_at IS NULL"
# key_id first: it is exact, while a name could in theory look like an id.
ACTIVE_KEY_ID_BY = (
    "SELECT key_id FROM api_keys WHERE key_id = ? AND revoked_at IS NULL",
    "SELECT key_id FROM api_keys WHERE name = ? AND revoked_at IS NULL",
)
INSERT_KEY = """
INSERT INTO api_keys (key_id, name, key_hash, models, adapters, rpm, tpm, token_budget,
                      budget_period, max_prompts_per_request, max_choices_per_request,
                      max_prompt_tokens_per_request, max_inflight_prompt_tokens, isolate_cache,
                      weight, top_priority, created_at, expires_at, revoked_at, admin)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
"""
UPSERT_KEY = (
    INSERT_KEY
    + """
ON CONFLICT (key_id) DO UPDATE SET
    name = excluded.name, key_hash = excluded.key_hash, models = excluded.models,
    adapters = excluded.adapters, rpm = excluded.rpm, tpm = excluded.tpm,
    token_budget = excluded.token_budget, budget_period = excluded.budget_period,
    max_prompts_per_request = excluded.max_prompts_per_request,
    max_choices_per_request = excluded.max_choices_per_request,
    max_prompt_tokens_per_request = excluded.max_prompt_tokens_per_request,
    max_inflight_prompt_tokens = excluded.max_inflight_prompt_tokens,
    isolate_cache = excluded.isolate_cache, weight = excluded.weight,
    top_priority = excluded.top_priority,
    created_at = excluded.created_at, expires_at = excluded.expires_at,
    revoked_at = excluded.revoked_at, admin = excluded.admin
"""
)
REVOKE = "UPDATE api_keys SET revoked_at = ? WHERE key_id = ?"
# Values in records.LIMIT_COLUMNS order, then the key_id.
SET_LIMITS = """
UPDATE api_keys SET rpm = ?, tpm = ?, token_budget = ?, budget_period = ?,
    max_prompts_per_request = ?, max_choices_per_request = ?,
    max_prompt_tokens_per_request = ?, max_inflight_prompt_tokens = ?, isolate_cache = ?,
    weight = ?, top_priority = ?
WHERE key_id = ?
"""

ADD_USAGE = """
INSERT INTO usage_daily (key_id, model, day, requests, prompt_tokens, completion_tokens)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (key_id, model, day) DO UPDATE SET
    requests = requests + excluded.requests,
    prompt_tokens = prompt_tokens + excluded.prompt_tokens,
    completion_tokens = completion_tokens + excluded.completion_tokens
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
# One static statement with optional filters; days are ISO text, so text order is day order.
SELECT_USAGE = """
SELECT key_id, model, day, requests, prompt_tokens, completion_tokens FROM usage_daily
WHERE (?1 IS NULL OR key_id = ?1) AND (?2 IS NULL OR model = ?2)
  AND (?3 IS NULL OR day >= ?3) AND (?4 IS NULL OR day <= ?4)
ORDER BY day, key_id, model
"""
SPENT_TOKENS = """
SELECT COALESCE(SUM(prompt_tokens + completion_tokens), 0) FROM usage_daily
WHERE key_id = ? AND day >= ?
"""

# Shared limits (store/lease_rules.py): one pool per key and limit, one lease per pool
# and gateway. Times are Unix seconds.
LEASE_SCHEMA = """
CREATE TABLE IF NOT EXISTS quota_pools (
    key_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    period TEXT NOT NULL,
    spent INTEGER NOT NULL DEFAULT 0,
    leased INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, kind, period)
);
CREATE TABLE IF NOT EXISTS quota_leases (
    key_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    period TEXT NOT NULL,
    holder TEXT NOT NULL,
    held INTEGER NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (key_id, kind, period, holder)
);
CREATE INDEX IF NOT EXISTS quota_leases_holder ON quota_leases (holder);
CREATE TABLE IF NOT EXISTS auth_lockouts (
    client TEXT PRIMARY KEY,
    locked_until REAL NOT NULL
);
"""
KEY_LIMITS = "SELECT rpm, tpm, token_budget, revoked_at FROM api_keys WHERE key_id = ?"
POOL_CREATE = """
INSERT INTO quota_pools (key_id, kind, period, spent, leased) VALUES (?, ?, ?, ?, 0)
ON CONFLICT (key_id, kind, period) DO NOTHING
"""
POOL_GET = "SELECT spent, leased FROM quota_pools WHERE key_id = ? AND kind = ? AND period = ?"
POOL_PUT = """
UPDATE quota_pools SET spent = ?, leased = ? WHERE key_id = ? AND kind = ? AND period = ?
"""
POOL_EXPIRED = """
SELECT COALESCE(SUM(held), 0) FROM quota_leases
WHERE key_id = ? AND kind = ? AND period = ? AND expires_at < ?
"""
POOL_REAP = """
DELETE FROM quota_leases WHERE key_id = ? AND kind = ? AND period = ? AND expires_at < ?
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
LEASE_DROP = "DELETE FROM quota_leases WHERE key_id = ? AND kind = ? AND period = ? AND holder = ?"
LEASES_RENEW = "UPDATE quota_leases SET expires_at = ? WHERE holder = ?"
LOCKOUT_PUT = """
INSERT INTO auth_lockouts (client, locked_until) VALUES (?, ?)
ON CONFLICT (client) DO UPDATE SET locked_until = MAX(locked_until, excluded.locked_until)
"""
LOCKOUTS_FORGET = "DELETE FROM auth_lockouts WHERE locked_until < ?"
LOCKOUTS_ACTIVE = "SELECT client, locked_until FROM auth_lockouts WHERE locked_until > ?"

# The fair queue's demand, per gateway and model (store/queue_demand.py). Times are Unix seconds.
QUEUE_SCHEMA = """
CREATE TABLE IF NOT EXISTS queue_demand (
    gateway TEXT NOT NULL,
    model TEXT NOT NULL,
    demand TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (gateway, model)
);
"""
DEMAND_DROP_MINE = "DELETE FROM queue_demand WHERE gateway = ?"
DEMAND_DROP_OLD = "DELETE FROM queue_demand WHERE updated_at < ?"
DEMAND_PUT = "INSERT INTO queue_demand (gateway, model, demand, updated_at) VALUES (?, ?, ?, ?)"
DEMAND_FRESH = "SELECT gateway, model, demand, updated_at FROM queue_demand WHERE updated_at >= ?"

# Where each gateway process's peer bus listens (gateway/peers/): one row a process, rewritten
# every round. Times are Unix seconds.
PEERS_SCHEMA = """
CREATE TABLE IF NOT EXISTS gateway_peers (
    peer TEXT PRIMARY KEY,
    address TEXT NOT NULL,
    seen_at REAL NOT NULL
);
"""
PEER_PUT = """
INSERT INTO gateway_peers (peer, address, seen_at) VALUES (?, ?, ?)
ON CONFLICT (peer) DO UPDATE SET address = excluded.address, seen_at = excluded.seen_at
"""
PEER_DROP = "DELETE FROM gateway_peers WHERE peer = ?"
PEERS_DROP_OLD = "DELETE FROM gateway_peers WHERE seen_at < ?"
PEERS_FRESH = "SELECT peer, address FROM gateway_peers WHERE seen_at >= ? ORDER BY peer"
