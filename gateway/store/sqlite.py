"""The SQLite backend: one file, WAL, every call on a worker thread.

sqlite3 blocks, so each call runs through asyncio.to_thread; one connection guarded by a lock is
enough for a gateway's load (reads are served from the in-memory key cache, usage is batched).
WAL lets the CLI create a key while a gateway is reading, and busy_timeout rides out the short
write locks between processes.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import Callable
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TypeVar

from gateway.store.base import KEY_ID_ATTEMPTS, MASTER_SECRET_NAME, KeyNameTaken, Store
from gateway.store.keyformat import hash_api_key, new_api_key, new_key_id
from gateway.store.models import ApiKey, UsageDelta, UsageRow
from gateway.store.validate import check_key_name, check_models, utc
from workflows.engine_keys import new_master_secret

T = TypeVar("T")

_SCHEMA = """
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
    revoked_at TEXT
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

_SELECT_KEYS = (
    "SELECT key_id, name, key_hash, models, created_at, expires_at, revoked_at FROM api_keys"
)
_INSERT_KEY = (
    "INSERT INTO api_keys (key_id, name, key_hash, models, created_at, expires_at, revoked_at) "
    "VALUES (?, ?, ?, ?, ?, ?, NULL)"
)
# key_id first: it is exact, while a name could in theory look like an id.
_REVOKE_BY = (
    "UPDATE api_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL",
    "UPDATE api_keys SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL",
)
# One static statement with optional filters: no SQL is ever assembled from strings.
_SELECT_USAGE = """
SELECT key_id, model, day, requests, prompt_tokens, completion_tokens FROM usage_daily
WHERE (?1 IS NULL OR key_id = ?1) AND (?2 IS NULL OR model = ?2) AND (?3 IS NULL OR day >= ?3)
ORDER BY day, key_id, model
"""


def _ts(moment: datetime | None) -> str | None:
    # Fixed width, so text order is time order.
    return None if moment is None else moment.astimezone(UTC).isoformat(timespec="microseconds")


def _parse_ts(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def _key_from_row(row: sqlite3.Row) -> ApiKey:
    created = _parse_ts(row["created_at"])
    assert created is not None
    return ApiKey(
        key_id=row["key_id"],
        name=row["name"],
        key_hash=row["key_hash"],
        models=None if row["models"] is None else json.loads(row["models"]),
        created_at=created,
        expires_at=_parse_ts(row["expires_at"]),
        revoked_at=_parse_ts(row["revoked_at"]),
    )


class SqliteStore(Store):
    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._secret: bytes | None = None

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: we open transactions ourselves, so none is left dangling.
            conn = sqlite3.connect(
                self._path, timeout=10.0, isolation_level=None, check_same_thread=False
            )
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA busy_timeout=10000")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._conn = conn
        return self._conn

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            with self._lock:
                return fn(self._connect())

        return await asyncio.to_thread(call)

    async def _transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call(conn: sqlite3.Connection) -> T:
            # IMMEDIATE takes the write lock up front, so two processes never deadlock upgrading
            # read locks.
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result

        return await self._run(call)

    async def init(self) -> None:
        await self._run(lambda conn: conn.executescript(_SCHEMA))

    async def close(self) -> None:
        def call() -> None:
            with self._lock:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None

        await asyncio.to_thread(call)

    async def master_secret(self) -> bytes:
        if self._secret is None:

            def call(conn: sqlite3.Connection) -> bytes:
                conn.execute(
                    "INSERT INTO secrets (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
                    (MASTER_SECRET_NAME, new_master_secret()),
                )
                row = conn.execute(
                    "SELECT value FROM secrets WHERE name = ?", (MASTER_SECRET_NAME,)
                ).fetchone()
                return bytes(row["value"])

            self._secret = await self._transaction(call)
        return self._secret

    async def create_key(
        self, name: str, models: list[str] | None = None, expires_at: datetime | None = None
    ) -> tuple[ApiKey, str]:
        check_key_name(name)
        models = check_models(models)
        expires_at = utc(expires_at)
        created_at = datetime.now(UTC)

        def call(conn: sqlite3.Connection) -> tuple[ApiKey, str]:
            taken = conn.execute(
                "SELECT 1 FROM api_keys WHERE name = ? AND revoked_at IS NULL", (name,)
            ).fetchone()
            if taken:
                raise KeyNameTaken(name)
            for _ in range(KEY_ID_ATTEMPTS):
                key_id = new_key_id()
                if conn.execute("SELECT 1 FROM api_keys WHERE key_id = ?", (key_id,)).fetchone():
                    continue
                plaintext = new_api_key(key_id)
                record = ApiKey(
                    key_id=key_id,
                    name=name,
                    key_hash=hash_api_key(plaintext),
                    models=models,
                    created_at=created_at,
                    expires_at=expires_at,
                )
                conn.execute(
                    _INSERT_KEY,
                    (
                        record.key_id,
                        record.name,
                        record.key_hash,
                        None if models is None else json.dumps(models),
                        _ts(record.created_at),
                        _ts(record.expires_at),
                    ),
                )
                return record, plaintext
            raise RuntimeError("could not find a free key_id")

        try:
            return await self._transaction(call)
        except sqlite3.IntegrityError as exc:
            # Another process took the name between our check and our insert.
            raise KeyNameTaken(name) from exc

    async def get_key(self, key_id: str) -> ApiKey | None:
        def call(conn: sqlite3.Connection) -> ApiKey | None:
            row = conn.execute(_SELECT_KEYS + " WHERE key_id = ?", (key_id,)).fetchone()
            return None if row is None else _key_from_row(row)

        return await self._run(call)

    async def list_keys(self) -> list[ApiKey]:
        def call(conn: sqlite3.Connection) -> list[ApiKey]:
            rows = conn.execute(_SELECT_KEYS + " ORDER BY created_at, key_id").fetchall()
            return [_key_from_row(row) for row in rows]

        return await self._run(call)

    async def revoke_key(self, name_or_id: str) -> bool:
        now = _ts(datetime.now(UTC))

        def call(conn: sqlite3.Connection) -> bool:
            return any(conn.execute(query, (now, name_or_id)).rowcount for query in _REVOKE_BY)

        return await self._transaction(call)

    async def add_usage(self, rows: list[UsageDelta]) -> None:
        if not rows:
            return
        params = [
            (r.key_id, r.model, r.day.isoformat(), r.requests, r.prompt_tokens, r.completion_tokens)
            for r in rows
        ]

        def call(conn: sqlite3.Connection) -> None:
            conn.executemany(
                """
                INSERT INTO usage_daily
                    (key_id, model, day, requests, prompt_tokens, completion_tokens)
                VALUES (?, ?, ?, ?, ?, ?)
                ON CONFLICT (key_id, model, day) DO UPDATE SET
                    requests = requests + excluded.requests,
                    prompt_tokens = prompt_tokens + excluded.prompt_tokens,
                    completion_tokens = completion_tokens + excluded.completion_tokens
                """,
                params,
            )

        await self._transaction(call)

    async def usage(
        self, key_id: str | None = None, model: str | None = None, since: date | None = None
    ) -> list[UsageRow]:
        params = (key_id, model, None if since is None else since.isoformat())

        def call(conn: sqlite3.Connection) -> list[UsageRow]:
            return [
                UsageRow(
                    key_id=row["key_id"],
                    model=row["model"],
                    day=date.fromisoformat(row["day"]),
                    requests=row["requests"],
                    prompt_tokens=row["prompt_tokens"],
                    completion_tokens=row["completion_tokens"],
                )
                for row in conn.execute(_SELECT_USAGE, params).fetchall()
            ]

        return await self._run(call)
