"""One way to run the fleet tables' SQL on either backend.

The fleet's statements are written once, with `?` placeholders, and run on SQLite (a thread of
its own holding one connection: sqlite3 blocks) or on PostgreSQL (asyncpg, placeholders turned
into `$1, $2, ...` as store/dialect.py does for the key store's). A transaction is a block of
awaits on a `Tx`; a broken unique or key constraint is `Conflict` on both, so callers never
see a driver's exceptions.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

from store.dialect import numbered

Row = Sequence[Any]


class Conflict(Exception):
    """A constraint refused the write: another writer got there first."""


class Tx(Protocol):
    async def execute(self, sql: str, *args: object) -> int:
        """Run a statement; the number of rows it changed."""

    async def fetch(self, sql: str, *args: object) -> list[Row]: ...

    async def fetchone(self, sql: str, *args: object) -> Row | None: ...


class Db(Protocol):
    dialect: str  # "sqlite" or "postgres": for the few statements that differ

    def transaction(self, readonly: bool = False) -> AbstractAsyncContextManager[Tx]:
        """A transaction: committed when the block ends, rolled back when it raises. A
        read-only one sees one snapshot of the whole database."""

    async def close(self) -> None: ...


class SqliteDb:
    """One connection on one thread. Writes take the file's write lock at BEGIN IMMEDIATE,
    so two processes' transactions run one after the other, never interleaved."""

    dialect = "sqlite"

    def __init__(self, path: Path) -> None:
        self._path = path
        self._conn: sqlite3.Connection | None = None
        # One thread: the connection is only ever used from it, and statements run in order.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleet-sqlite")
        self._lock = asyncio.Lock()

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA busy_timeout=10000")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._conn = conn
        return self._conn

    async def _call(self, fn: Any, *args: object) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def _begin(self, readonly: bool) -> sqlite3.Connection:
        conn = self._connect()
        if conn.in_transaction:
            # A caller cancelled while its BEGIN or ROLLBACK was on this thread: what it began
            # was never committed, and is dropped here before anything else runs.
            conn.execute("ROLLBACK")
        conn.execute("BEGIN" if readonly else "BEGIN IMMEDIATE")
        return conn

    @asynccontextmanager
    async def transaction(self, readonly: bool = False) -> AsyncIterator[Tx]:
        async with self._lock:
            conn: sqlite3.Connection = await self._call(self._begin, readonly)
            try:
                yield _SqliteTx(conn, self._call)
            except BaseException:
                await self._call(conn.execute, "ROLLBACK")
                raise
            await self._call(conn.execute, "COMMIT")

    async def close(self) -> None:
        async with self._lock:
            if self._conn is not None:
                await self._call(self._conn.close)
                self._conn = None
        self._thread.shutdown(wait=False)


class _SqliteTx:
    def __init__(self, conn: sqlite3.Connection, call: Any) -> None:
        self._conn = conn
        self._call = call

    def _run(self, sql: str, args: tuple[object, ...], rows: bool) -> Any:
        try:
            cursor = self._conn.execute(sql, args)
        except sqlite3.IntegrityError as err:
            raise Conflict(str(err)) from None
        return cursor.fetchall() if rows else cursor.rowcount

    async def execute(self, sql: str, *args: object) -> int:
        count: int = await self._call(self._run, sql, args, False)
        return count

    async def fetch(self, sql: str, *args: object) -> list[Row]:
        found: list[Row] = await self._call(self._run, sql, args, True)
        return found

    async def fetchone(self, sql: str, *args: object) -> Row | None:
        rows = await self.fetch(sql, *args)
        return rows[0] if rows else None


class PostgresDb:
    dialect = "postgres"

    def __init__(self, url: str, max_size: int = 10) -> None:
        self._url = url
        self._max_size = max_size
        self._pool: Any = None
        self._opening = asyncio.Lock()

    async def _get_pool(self) -> Any:
        async with self._opening:
            if self._pool is None:
                import asyncpg

                self._pool = await asyncpg.create_pool(
                    self._url, min_size=1, max_size=self._max_size
                )
        return self._pool

    @asynccontextmanager
    async def transaction(self, readonly: bool = False) -> AsyncIterator[Tx]:
        pool = await self._get_pool()
        async with pool.acquire() as conn:
            isolation = "repeatable_read" if readonly else "read_committed"
            async with conn.transaction(isolation=isolation, readonly=readonly):
                yield _PostgresTx(conn)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None


class _PostgresTx:
    def __init__(self, conn: Any) -> None:
        self._conn = conn

    async def execute(self, sql: str, *args: object) -> int:
        import asyncpg

        try:
            status: str = await self._conn.execute(numbered(sql), *args)
        except asyncpg.IntegrityConstraintViolationError as err:
            raise Conflict(str(err)) from None
        tail = status.rsplit(" ", 1)[-1]
        return int(tail) if tail.isdigit() else 0

    async def fetch(self, sql: str, *args: object) -> list[Row]:
        import asyncpg

        try:
            rows: list[Row] = await self._conn.fetch(numbered(sql), *args)
        except asyncpg.IntegrityConstraintViolationError as err:
            raise Conflict(str(err)) from None
        return rows

    async def fetchone(self, sql: str, *args: object) -> Row | None:
        rows = await self.fetch(sql, *args)
        return rows[0] if rows else None
