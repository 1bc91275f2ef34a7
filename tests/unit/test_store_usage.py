"""Usage queries by period and the token spend a budget starts from, on both backends
(fixtures from test_store)."""

# Fixtures are imported by name and then requested as parameters of the same name.
# ruff: noqa: F811

from __future__ import annotations

from datetime import date, timedelta

import pytest
from pydantic import ValidationError

from store import Store, UsageDelta
from store.models import MAX_COUNT
from tests.unit.test_store import backend, open_test_store, store  # noqa: F401

MARCH = [date(2025, 3, d) for d in range(1, 6)]


async def _one_row_a_day(store: Store, key_id: str = "k1", model: str = "m") -> None:
    await store.add_usage(
        [
            UsageDelta(
                key_id=key_id,
                model=model,
                day=day,
                requests=1,
                prompt_tokens=10 * n,
                completion_tokens=n,
            )
            for n, day in enumerate(MARCH, start=1)
        ]
    )


async def test_since_and_until_both_include_their_day(store: Store) -> None:
    await _one_row_a_day(store)
    rows = await store.usage(since=MARCH[1], until=MARCH[3])
    assert [r.day for r in rows] == MARCH[1:4]
    assert [r.day for r in await store.usage(until=MARCH[0])] == [MARCH[0]]
    assert [r.day for r in await store.usage(since=MARCH[4])] == [MARCH[4]]
    assert await store.usage(since=MARCH[3], until=MARCH[1]) == []


async def test_period_filters_combine_with_key_and_model(store: Store) -> None:
    await _one_row_a_day(store, "k1", "m")
    await _one_row_a_day(store, "k2", "m")
    await _one_row_a_day(store, "k1", "other")
    rows = await store.usage(key_id="k1", model="m", since=MARCH[2], until=MARCH[2])
    assert [(r.key_id, r.model, r.day, r.prompt_tokens) for r in rows] == [
        ("k1", "m", MARCH[2], 30)
    ]


async def test_spent_tokens_sums_prompt_and_completion_from_a_day_on(store: Store) -> None:
    await _one_row_a_day(store, "k1", "m")
    await _one_row_a_day(store, "k1", "other")  # every model counts against one budget
    await _one_row_a_day(store, "k2", "m")  # another key's spend does not
    # Days 3, 4, 5: (30+3) + (40+4) + (50+5) = 132 per model, on two models.
    assert await store.spent_tokens("k1", MARCH[2]) == 264
    assert await store.spent_tokens("k1", MARCH[4] + timedelta(days=1)) == 0
    assert await store.spent_tokens("unknown", MARCH[0]) == 0


async def test_spent_tokens_is_exact_for_large_totals(store: Store) -> None:
    # PostgreSQL sums BIGINT into NUMERIC; the answer must still be an exact int.
    big = 4_000_000_000_000
    await store.add_usage(
        [
            UsageDelta(key_id="k", model="m", day=MARCH[0], prompt_tokens=big),
            UsageDelta(key_id="k", model="m", day=MARCH[1], completion_tokens=big + 1),
        ]
    )
    spent = await store.spent_tokens("k", MARCH[0])
    assert spent == 2 * big + 1
    assert isinstance(spent, int)


def test_a_count_beyond_64_bits_is_refused_before_the_store() -> None:
    with pytest.raises(ValidationError, match="requests"):
        UsageDelta(key_id="k", model="m", day=MARCH[0], requests=MAX_COUNT + 1)
