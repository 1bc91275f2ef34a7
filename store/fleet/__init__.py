"""The fleet's resources and routes: node capacity, allocations and the routing table, kept in
the same database as the keys (the SQLite file, or PostgreSQL when a URL is given).

Temporal keeps the lifecycles; these tables keep what the lifecycles hold. The control
worker's activities write them (activities/control/fleet_activities.py), gateways read routes
from them by version (gateway/route_source.py), and every write is one transaction whose
constraints make double booking impossible (schema.py).
"""

from __future__ import annotations

from pathlib import Path

from store.factory import SQLITE_FILENAME, SQLITE_URL_PREFIX
from store.fleet.db import Conflict, PostgresDb, SqliteDb
from store.fleet.tables import FleetTables

__all__ = ["Conflict", "FleetTables", "open_fleet"]


def open_fleet(database_url: str | None, state_dir: Path, pool_size: int = 10) -> FleetTables:
    """The fleet tables in the store `open_store` would open for the same arguments. Nothing
    connects until the first call; call `init()` before use."""
    if not database_url:
        return FleetTables(SqliteDb(state_dir / SQLITE_FILENAME))
    if database_url.startswith(("postgresql://", "postgres://")):
        return FleetTables(PostgresDb(database_url, max_size=pool_size))
    if database_url.startswith(SQLITE_URL_PREFIX) and len(database_url) > len(SQLITE_URL_PREFIX):
        path = Path(database_url.removeprefix(SQLITE_URL_PREFIX)).expanduser()
        return FleetTables(SqliteDb(path))
    raise ValueError(
        "unsupported database URL: expected postgresql://... or sqlite:///PATH; "
        "leave it unset to use the SQLite file in the state directory"
    )
