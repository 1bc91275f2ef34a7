"""Choosing a backend from configuration."""

from __future__ import annotations

from pathlib import Path

from store.base import Store

SQLITE_FILENAME = "llmgw.db"
SQLITE_URL_PREFIX = "sqlite:///"


def open_store(database_url: str | None, state_dir: Path) -> Store:
    """PostgreSQL for a postgresql:// URL (LLMGW_DATABASE_URL); a SQLite file for
    sqlite:///PATH (SQLAlchemy's spelling: four slashes for an absolute path); else the SQLite
    file `state_dir/llmgw.db`. Nothing connects until the first call; call `init()` before
    use."""
    from store.sqlite import SqliteStore

    if not database_url:
        return SqliteStore(state_dir / SQLITE_FILENAME)
    if database_url.startswith(("postgresql://", "postgres://")):
        from store.postgres import PostgresStore

        return PostgresStore(database_url)
    if database_url.startswith(SQLITE_URL_PREFIX) and len(database_url) > len(SQLITE_URL_PREFIX):
        return SqliteStore(Path(database_url.removeprefix(SQLITE_URL_PREFIX)).expanduser())
    raise ValueError(
        "unsupported database URL: expected postgresql://... or sqlite:///PATH; "
        "leave it unset to use the SQLite file in the state directory"
    )


def redacted_url(database_url: str) -> str:
    """The URL with any password masked, for messages and logs."""
    scheme, sep, rest = database_url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return database_url
    return f"{scheme}://{userinfo.partition(':')[0]}:***@{host}"
