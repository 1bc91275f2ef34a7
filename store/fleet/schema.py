"""The fleet's tables: nodes, allocations and what they claim, routes, and two counters.

- `fleet_nodes`: each node's record as placement reads it, its state, and `rev`, a fresh random
  number written with every change to the node or to what is allocated on it, with `writer`,
  the placer that made the change ("" for any other). A placement commits only where the node
  is still at the rev its placer read, or was last written by that same placer (whose memory
  holds all it wrote): whoever else changed the node since, the placement fails and is decided
  again on what is there now.
- `fleet_claims`: one row per port and per GPU an allocation holds, keyed by (node, item), so
  no two allocations can ever hold the same port or device, whatever the code above does.
- `fleet_routes`: one row per replica that has a route; a route withdrawn keeps its row without
  a document (a tombstone) so gateways reading changes since their version see it go. Every
  change takes the next `route_version`, in the same transaction, so versions commit in order.
- `fleet_counters`: `route_version`, and `route_floor`, below which tombstones are pruned (a
  gateway holding an older version reads the whole table again).
- `fleet_meta`: the `epoch` (made once, with the tables: a gateway that sees another epoch is
  reading another store) and the models scaled to zero (`idle_models`, JSON).
"""

from __future__ import annotations

import secrets

from store.fleet.db import Db

TABLES = (
    "CREATE TABLE IF NOT EXISTS fleet_counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS fleet_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS fleet_nodes (name TEXT PRIMARY KEY, state TEXT NOT NULL, "
    "rev BIGINT NOT NULL, writer TEXT NOT NULL DEFAULT '', record TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS fleet_allocations (replica_id TEXT PRIMARY KEY, "
    "model TEXT NOT NULL, workflow_id TEXT NOT NULL, doc TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS fleet_claims (node TEXT NOT NULL, item TEXT NOT NULL, "
    "replica_id TEXT NOT NULL, PRIMARY KEY (node, item))",
    "CREATE INDEX IF NOT EXISTS fleet_claims_replica ON fleet_claims (replica_id)",
    "CREATE TABLE IF NOT EXISTS fleet_routes (replica_id TEXT PRIMARY KEY, model TEXT NOT NULL, "
    "node TEXT NOT NULL, version BIGINT NOT NULL, doc TEXT)",
    "CREATE INDEX IF NOT EXISTS fleet_routes_version ON fleet_routes (version)",
    "CREATE INDEX IF NOT EXISTS fleet_routes_node ON fleet_routes (node)",
    "CREATE INDEX IF NOT EXISTS fleet_routes_model ON fleet_routes (model)",
)
# Any constant: processes starting together on one PostgreSQL create the tables one at a time
# (CREATE TABLE IF NOT EXISTS is not safe against itself in PostgreSQL).
_SCHEMA_LOCK = 0x6C6C6D67
ROUTE_VERSION = "route_version"
ROUTE_FLOOR = "route_floor"
EPOCH = "epoch"
IDLE_MODELS = "idle_models"


async def create(db: Db) -> None:
    async with db.transaction() as tx:
        if db.dialect == "postgres":
            await tx.execute("SELECT pg_advisory_xact_lock(?)", _SCHEMA_LOCK)
        for statement in TABLES:
            await tx.execute(statement)
        for name in (ROUTE_VERSION, ROUTE_FLOOR):
            await tx.execute(
                "INSERT INTO fleet_counters (name, value) VALUES (?, 0) ON CONFLICT DO NOTHING",
                name,
            )
        for name, value in ((EPOCH, secrets.token_hex(8)), (IDLE_MODELS, "[]")):
            await tx.execute(
                "INSERT INTO fleet_meta (name, value) VALUES (?, ?) ON CONFLICT DO NOTHING",
                name,
                value,
            )
