"""What differs between the SQL the store sends to SQLite and to PostgreSQL, and nothing else.

Every statement is written once (store/statements.py, store/schema.py): `?` placeholders (or
`?1`, `?2`, ... where a value is used twice), and a marker in braces where the two databases
spell a thing differently. `Dialect.render` turns that into one backend's SQL.

The markers:
- column types: `{timestamp}`, `{bytes}`, `{day}`, `{count}`, `{seconds}`;
- `{for_update}`: lock the rows read until the transaction ends. PostgreSQL needs it; SQLite
  has no row locks, and its BEGIN IMMEDIATE already holds the whole file;
- `{skip_locked}`: a subquery's rows another transaction holds are left to it, so two
  PostgreSQL transactions deleting the same stale rows never deadlock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache


@lru_cache(maxsize=256)
def numbered(sql: str) -> str:
    """`?` placeholders as PostgreSQL's `$1, $2, ...`, and `?N` as `$N` (no statement has a
    `?` in a string literal)."""
    count = iter(range(1, 1_000))
    return re.sub(r"\?(\d*)", lambda m: f"${m.group(1) or next(count)}", sql)


@dataclass(frozen=True)
class Dialect:
    name: str
    # The marker -> the text it stands for.
    spellings: dict[str, str] = field(default_factory=dict)
    numbered_placeholders: bool = False
    # DELETE ... RETURNING: SQLite has it only from 3.35, and Python may bring an older one.
    delete_returning: bool = False

    def render(self, sql: str) -> str:
        text = sql.format_map(self.spellings)
        return numbered(text) if self.numbered_placeholders else text


SQLITE = Dialect(
    "sqlite",
    {
        # ISO text of fixed width, so text order is time order (store/sqlite.py).
        "timestamp": "TEXT",
        "bytes": "BLOB",
        "day": "TEXT",  # ISO text, so text order is day order
        "count": "INTEGER",  # 64-bit in SQLite
        "seconds": "REAL",  # 8 bytes in SQLite
        "for_update": "",
        "skip_locked": "",
    },
)

POSTGRES = Dialect(
    "postgres",
    {
        "timestamp": "TIMESTAMPTZ",
        "bytes": "BYTEA",
        "day": "DATE",
        "count": "BIGINT",
        # 8 bytes: PostgreSQL's REAL is 4.
        "seconds": "DOUBLE PRECISION",
        "for_update": " FOR UPDATE",
        "skip_locked": " FOR UPDATE SKIP LOCKED",
    },
    numbered_placeholders=True,
    delete_returning=True,
)
