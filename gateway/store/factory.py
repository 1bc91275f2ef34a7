"""Choosing a backend from configuration."""

from __future__ import annotations

from pathlib import Path

from gateway.store.base import Store

SQLITE_FILENAME = "llmgw.db"


def open_store(database_url: str | None, state_dir: Path) -> Store:
    """PostgreSQL when a postgres URL is given (LLMGW_DATABASE_URL), else the SQLite file
    `state_dir/llmgw.db`. Nothing connects until the first call; call `init()` before use."""
    if database_url:
        if database_url.startswith(("postgresql://", "postgres://")):
            from gateway.store.postgres import PostgresStore

            return PostgresStore(database_url)
        raise ValueError(
            "unsupported database URL: expected postgresql://...; "
            "leave it unset to use the SQLite file in the state directory"
        )
    from gateway.store.sqlite import SqliteStore

    return SqliteStore(state_dir / SQLITE_FILENAME)
