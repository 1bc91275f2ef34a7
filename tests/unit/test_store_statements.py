"""The store's statements and tables, written once (store/statements.py, store/schema.py), as each
backend gets them; the cases that run them are test_store*.py, on both backends."""

from __future__ import annotations

import re

import pytest

from store.dialect import POSTGRES, SQLITE, Dialect
from store.models import KeyLimits
from store.records import ADDED_KEY_COLUMNS, KEY_COLUMNS, LIMIT_COLUMNS
from store.schema import schema
from store.statements import POSTGRES_STATEMENTS, SQLITE_STATEMENTS, Statements

DIALECTS = [SQLITE, POSTGRES]


def _rendered(statements: Statements) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in vars(Statements):
        if name.isupper():
            value = getattr(statements, name)
            texts = value if isinstance(value, tuple) else (value,)
            for index, text in enumerate(texts):
                out[f"{name}[{index}]"] = text
    return out


def test_every_limit_is_a_column_that_an_older_table_gains() -> None:
    """A new KeyLimits field needs its line in records.ADDED_KEY_COLUMNS: that line is the
    column in a fresh table, in an upgraded one, and in every key statement."""
    added = [column for column, _ in ADDED_KEY_COLUMNS]
    assert set(KeyLimits.model_fields) <= set(added)
    assert set(LIMIT_COLUMNS) <= set(KEY_COLUMNS)


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)
def test_every_key_column_is_in_the_table_and_the_key_statements(dialect: Dialect) -> None:
    ddl = schema(dialect)
    api_keys = ddl[ddl.index("CREATE TABLE IF NOT EXISTS api_keys") :]
    api_keys = api_keys[: api_keys.index(");")]
    statements = Statements(dialect)
    for column in KEY_COLUMNS:
        assert re.search(rf"^\s+{column} ", api_keys, re.MULTILINE), column
        for text in (statements.SELECT_KEYS, statements.INSERT_KEY, statements.UPSERT_KEY):
            assert re.search(rf"\b{column}\b", text), (column, text)
    for column in LIMIT_COLUMNS:
        assert f"{column} = " in statements.SET_LIMITS


def test_sqlite_keeps_question_marks_and_postgres_numbers_them() -> None:
    for name, text in _rendered(SQLITE_STATEMENTS).items():
        assert "$" not in text, name
    for name, text in _rendered(POSTGRES_STATEMENTS).items():
        assert "?" not in text, name
        numbers = sorted({int(n) for n in re.findall(r"\$(\d+)", text)})
        assert numbers == list(range(1, len(numbers) + 1)), name


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)
def test_no_marker_is_left_unrendered(dialect: Dialect) -> None:
    texts = [schema(dialect), *_rendered(Statements(dialect)).values()]
    for text in texts:
        assert not re.search(r"[{}]", text), text


def test_the_two_backends_differ_only_where_the_dialect_says() -> None:
    assert "FOR UPDATE" in POSTGRES_STATEMENTS.POOL_GET
    assert "FOR UPDATE" not in SQLITE_STATEMENTS.POOL_GET
    assert "SKIP LOCKED" in POSTGRES_STATEMENTS.DEMAND_DROP_OLD
    assert "SKIP LOCKED" not in SQLITE_STATEMENTS.DEMAND_DROP_OLD
    assert "created_at TIMESTAMPTZ NOT NULL" in schema(POSTGRES)
    assert "created_at TEXT NOT NULL" in schema(SQLITE)
