"""The SQLite backend: one file, WAL, every call on a worker thread.

sqlite3 blocks, so each call runs through asyncio.to_thread; one connection guarded by a lock is
enough for a gateway's load (reads are served from the in-memory key cache, usage is batched).
WAL lets the CLI create a key while a gateway is reading, and busy_timeout rides out the short
write locks between processes.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, TypeVar

from store import lease_round
from store.base import KEY_ID_ATTEMPTS, KeyNameTaken, Store
from store.dialect import SQLITE
from store.dump_rules import check_dump, name_conflicts, write_order
from store.lease_rules import LeaseChange, LeaseState
from store.models import ApiKey, KeyLimits, StoreDump, UsageDelta, UsageRow
from store.queue_demand import Demand, DemandReport, demand_rows, reports
from store.records import (
    ADDED_KEY_COLUMNS,
    MASTER_SECRET_NAME,
    UPSTREAM_KEY_PREFIX,
    KeyDraft,
    key_from_row,
    key_values,
    limit_values,
    upstream_secret_name,
    usage_values,
)
from store.schema import schema
from store.statements import SQLITE_STATEMENTS as sql
from store.validate import check_text, check_upstream_key, storable
from workflows.engine_keys import new_master_secret

T = TypeVar("T")


def _ts(moment: datetime | None) -> str | None:
    # Fixed width, so text order is time order.
    return None if moment is None else moment.astimezone(UTC).isoformat(timespec="microseconds")


def _parse_ts(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def _key(row: sqlite3.Row) -> ApiKey:
    return key_from_row(row, _parse_ts)


def _usage(row: sqlite3.Row) -> UsageRow:
    return UsageRow(
        key_id=row["key_id"],
        model=row["model"],
        day=date.fromisoformat(row["day"]),
        requests=row["requests"],
        prompt_tokens=row["prompt_tokens"],
        completion_tokens=row["completion_tokens"],
    )


def _active_key_id(conn: sqlite3.Connection, name_or_id: str) -> str | None:
    for query in sql.ACTIVE_KEY_ID_BY:
        row = conn.execute(query, (name_or_id,)).fetchone()
        if row is not None:
            return str(row["key_id"])
    return None


def _upgrade(conn: sqlite3.Connection) -> None:
    present = {row["name"] for row in conn.execute("PRAGMA table_info(api_keys)")}
    for column, sql_type in ADDED_KEY_COLUMNS:
        if column not in present:
            # Both names are constants from records.py, never input.
            conn.execute(f"ALTER TABLE api_keys ADD COLUMN {column} {sql_type}")


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
            _switch_to_wal(conn)
            conn.execute("PRAGMA busy_timeout=10000")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._conn = conn
        return self._conn

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            with self._lock:
                result = fn(self._connect())
                # Nothing of the connection may leave the lock. A cursor returned from here is
                # finalised later on the event loop's thread while a worker thread uses the
                # connection: SQLite answers "bad parameter or other API misuse". Seen under
                # concurrent usage flushes; `_write` is the way to run a statement for effect.
                if isinstance(result, sqlite3.Cursor):
                    result.close()
                    raise TypeError("a store call returned a cursor; return rows or use _write")
                return result

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

    async def _write(
        self, statement: str, params: Sequence[Any] = (), *, many: bool = False
    ) -> None:
        """Run one statement for its effect, in a transaction of its own."""

        def call(conn: sqlite3.Connection) -> None:
            if many:
                conn.executemany(statement, params).close()
            else:
                conn.execute(statement, params).close()

        await self._transaction(call)

    async def init(self) -> None:
        await self._run(lambda conn: conn.executescript(schema(SQLITE)).close())
        # In a transaction, so two processes starting at once add each column once.
        await self._transaction(_upgrade)

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
                conn.execute(sql.SECRETS_ADD, (MASTER_SECRET_NAME, new_master_secret()))
                row = conn.execute(sql.SECRETS_GET, (MASTER_SECRET_NAME,)).fetchone()
                return bytes(row["value"])

            self._secret = await self._transaction(call)
        return self._secret

    async def create_key(
        self,
        name: str,
        models: list[str] | None = None,
        expires_at: datetime | None = None,
        adapters: list[str] | None = None,
        limits: KeyLimits | None = None,
        admin: bool = False,
    ) -> tuple[ApiKey, str]:
        draft = KeyDraft(name, models, expires_at, adapters, limits, admin)

        def call(conn: sqlite3.Connection) -> tuple[ApiKey, str]:
            if conn.execute(sql.NAME_TAKEN, (draft.name,)).fetchone():
                raise KeyNameTaken(draft.name)
            for _ in range(KEY_ID_ATTEMPTS):
                record, plaintext = draft.draw()
                if conn.execute(sql.KEY_ID_EXISTS, (record.key_id,)).fetchone():
                    continue
                conn.execute(sql.INSERT_KEY, key_values(record, _ts))
                return record, plaintext
            raise RuntimeError("could not find a free key_id")

        try:
            return await self._transaction(call)
        except sqlite3.IntegrityError as exc:
            # Another process took the name between our check and our insert.
            raise KeyNameTaken(name) from exc

    async def get_key(self, key_id: str) -> ApiKey | None:
        if not storable(key_id):
            return None

        def call(conn: sqlite3.Connection) -> ApiKey | None:
            row = conn.execute(sql.SELECT_KEY, (key_id,)).fetchone()
            return None if row is None else _key(row)

        return await self._run(call)

    async def list_keys(self) -> list[ApiKey]:
        def call(conn: sqlite3.Connection) -> list[ApiKey]:
            return [_key(row) for row in conn.execute(sql.SELECT_KEYS_ORDERED).fetchall()]

        return await self._run(call)

    async def revoke_key(self, name_or_id: str) -> bool:
        if not storable(name_or_id):
            return False
        now = _ts(datetime.now(UTC))

        def call(conn: sqlite3.Connection) -> bool:
            key_id = _active_key_id(conn, name_or_id)
            if key_id is None:
                return False
            conn.execute(sql.REVOKE, (now, key_id))
            return True

        return await self._transaction(call)

    async def set_key_limits(self, name_or_id: str, limits: KeyLimits) -> ApiKey | None:
        limits = KeyLimits.model_validate(limits)
        if not storable(name_or_id):
            return None

        def call(conn: sqlite3.Connection) -> ApiKey | None:
            key_id = _active_key_id(conn, name_or_id)
            if key_id is None:
                return None
            conn.execute(
                sql.SET_LIMITS,
                (*limit_values(limits), key_id),
            )
            row = conn.execute(sql.SELECT_KEY, (key_id,)).fetchone()
            return _key(row)

        return await self._transaction(call)

    async def add_usage(self, rows: list[UsageDelta]) -> None:
        if not rows:
            return
        params = [usage_values(r, date.isoformat) for r in rows]
        await self._write(sql.ADD_USAGE, params, many=True)

    async def usage(
        self,
        key_id: str | None = None,
        model: str | None = None,
        since: date | None = None,
        until: date | None = None,
    ) -> list[UsageRow]:
        params = (
            None if key_id is None else check_text(key_id, "key_id"),
            None if model is None else check_text(model, "model"),
            None if since is None else since.isoformat(),
            None if until is None else until.isoformat(),
        )

        def call(conn: sqlite3.Connection) -> list[UsageRow]:
            return [_usage(row) for row in conn.execute(sql.SELECT_USAGE, params).fetchall()]

        return await self._run(call)

    async def spent_tokens(self, key_id: str, since: date) -> int:
        params = (check_text(key_id, "key_id"), since.isoformat())

        def call(conn: sqlite3.Connection) -> int:
            return int(conn.execute(sql.SPENT_TOKENS, params).fetchone()[0])

        return await self._run(call)

    async def set_upstream_key(self, model: str, key: str | None) -> None:
        name = upstream_secret_name(model)
        if key is None:
            await self._write(sql.SECRETS_DELETE, (name,))
            return
        value = check_upstream_key(key).encode()
        await self._write(sql.SECRETS_PUT, (name, value))

    async def upstream_keys(self) -> dict[str, str]:
        def call(conn: sqlite3.Connection) -> dict[str, str]:
            return {
                row["name"].removeprefix(UPSTREAM_KEY_PREFIX): bytes(row["value"]).decode()
                for row in conn.execute(sql.SECRETS_ALL).fetchall()
                if row["name"].startswith(UPSTREAM_KEY_PREFIX)
            }

        return await self._run(call)

    async def export_dump(self) -> StoreDump:
        def call(conn: sqlite3.Connection) -> StoreDump:
            return StoreDump(
                secrets={
                    row["name"]: bytes(row["value"])
                    for row in conn.execute(sql.SECRETS_ALL).fetchall()
                },
                keys=[_key(row) for row in conn.execute(sql.SELECT_KEYS_ORDERED).fetchall()],
                usage=[
                    _usage(row)
                    for row in conn.execute(sql.SELECT_USAGE, (None, None, None, None)).fetchall()
                ],
            )

        # One transaction: a gateway flushing usage meanwhile lands wholly before or after.
        return await self._transaction(call)

    async def import_dump(self, dump: StoreDump, replace_secrets: bool = True) -> None:
        check_dump(dump)
        secret_sql = sql.SECRETS_PUT if replace_secrets else sql.SECRETS_ADD

        def call(conn: sqlite3.Connection) -> None:
            holders = {
                row["name"]: row["key_id"] for row in conn.execute(sql.ACTIVE_NAMES).fetchall()
            }
            name_conflicts(dump, holders)
            conn.executemany(secret_sql, list(dump.secrets.items()))
            conn.executemany(sql.UPSERT_KEY, [key_values(k, _ts) for k in write_order(dump.keys)])
            conn.executemany(sql.PUT_USAGE, [usage_values(r, date.isoformat) for r in dump.usage])

        try:
            await self._transaction(call)
        except sqlite3.IntegrityError as exc:
            # Only a hand-edited dump gets here (a key renamed onto another's name).
            raise ValueError(f"the dump's keys clash with the store's: {exc}") from None
        self._secret = None  # the master secret may have been replaced

    async def sync_leases(
        self, holder: str, ttl_s: float, changes: Sequence[LeaseChange]
    ) -> list[LeaseState]:
        # One host's clock: every process sharing a SQLite file reads the same one.
        return await self._transaction(
            lambda conn: lease_round.run_sync(
                conn,
                lease_round.sync_round(sql, holder, ttl_s, changes, time.time(), date.isoformat),
            )
        )

    async def lock_out(self, client: str, seconds: float) -> None:
        await self._transaction(
            lambda conn: lease_round.run_sync(
                conn, lease_round.lock_out(sql, client, seconds, time.time())
            )
        )

    async def lockouts(self) -> dict[str, float]:
        return await self._run(
            lambda conn: lease_round.run_sync(conn, lease_round.lockouts(sql, time.time()))
        )

    async def publish_queue_demand(self, gateway: str, demand: Demand, keep_s: float) -> None:
        rows = demand_rows(gateway, demand)

        def call(conn: sqlite3.Connection) -> None:
            now = time.time()
            conn.execute(sql.DEMAND_DROP_OLD, (now - keep_s,))
            conn.execute(sql.DEMAND_DROP_MINE, (gateway,))
            conn.executemany(sql.DEMAND_PUT, [(gateway, m, text, now) for m, text in rows])

        await self._transaction(call)

    async def queue_demands(self, within_s: float) -> list[DemandReport]:
        def call(conn: sqlite3.Connection) -> tuple[float, list[tuple[str, str, str, float]]]:
            now = time.time()
            found = conn.execute(sql.DEMAND_FRESH, (now - within_s,)).fetchall()
            return now, [
                (r["gateway"], r["model"], r["demand"], float(r["updated_at"])) for r in found
            ]

        now, rows = await self._run(call)
        return reports(rows, now)

    async def announce_peer(self, peer: str, address: str, keep_s: float) -> list[tuple[str, str]]:
        check_text(peer, "peer id")
        check_text(address, "peer address")

        def call(conn: sqlite3.Connection) -> list[tuple[str, str]]:
            now = time.time()
            conn.execute(sql.PEERS_DROP_OLD, (now - keep_s,))
            conn.execute(sql.PEER_PUT, (peer, address, now))
            found = conn.execute(sql.PEERS_FRESH, (now - keep_s,)).fetchall()
            return [(r["peer"], r["address"]) for r in found if r["peer"] != peer]

        return await self._transaction(call)

    async def withdraw_peer(self, peer: str) -> None:
        await self._transaction(lambda conn: conn.execute(sql.PEER_DROP, (peer,)))


def _switch_to_wal(conn: sqlite3.Connection, wait_s: float = 10.0) -> None:
    """WAL journal mode (persistent in the file: a no-op once set). Switching takes an exclusive
    lock, and SQLite answers "database is locked" at once, without its busy wait, when another
    connection is switching or writing at that moment (several gateways starting on one old
    file): so retried for up to `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
