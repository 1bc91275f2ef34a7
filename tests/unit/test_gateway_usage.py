"""Usage accounting: totals kept in memory, written in batches, nothing lost on store errors."""

from __future__ import annotations

from datetime import UTC, date, datetime
from types import SimpleNamespace

import pytest

from gateway import usage as usage_module
from gateway.usage import UsageRecorder
from store import Store, UsageDelta


async def test_requests_accumulate_and_flush_as_one_row_per_key_model_day(store: Store) -> None:
    recorder = UsageRecorder(store)
    day = date(2025, 5, 1)
    recorder.record("k1", "m", prompt_tokens=10, completion_tokens=3, day=day)
    recorder.record("k1", "m", prompt_tokens=5, completion_tokens=7, day=day)
    recorder.record("k2", "m", prompt_tokens=1, day=day)
    assert await recorder.flush() == 2
    assert await recorder.flush() == 0, "a flush writes each delta once"
    rows = {
        (r.key_id, r.requests, r.prompt_tokens, r.completion_tokens) for r in await store.usage()
    }
    assert rows == {("k1", 2, 15, 10), ("k2", 1, 1, 0)}


class FailingOnce:
    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.failures = 1

    async def add_usage(self, rows: list[UsageDelta]) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("store down")
        await self.inner.add_usage(rows)


async def test_a_failed_flush_keeps_the_deltas_for_the_next_one(store: Store) -> None:
    recorder = UsageRecorder(FailingOnce(store))  # type: ignore[arg-type]
    day = date(2025, 5, 1)
    recorder.record("k", "m", completion_tokens=4, day=day)
    with pytest.raises(ConnectionError):
        await recorder.flush()
    recorder.record("k", "m", completion_tokens=1, day=day)  # more traffic during the outage
    assert await recorder.flush() == 1
    (row,) = await store.usage()
    assert (row.requests, row.completion_tokens) == (2, 5)


def test_usage_counts_under_the_utc_day_the_request_was_settled_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Today is worked out once per day, not per request: the rows still change day at UTC
    midnight, and a clock set back across midnight counts under the earlier day again."""
    midnight = datetime(2025, 5, 2, tzinfo=UTC).timestamp()
    now = [midnight - 1.0]
    monkeypatch.setattr(usage_module, "time", SimpleNamespace(time=lambda: now[0]))
    recorder = UsageRecorder(None)  # type: ignore[arg-type]
    recorder.record("k", "m", completion_tokens=1)
    now[0] = midnight
    recorder.record("k", "m", completion_tokens=2)
    now[0] = midnight + 86399.5
    recorder.record("k", "m", completion_tokens=4)
    now[0] = midnight - 0.5  # the clock stepped back
    recorder.record("k", "m", completion_tokens=8)
    rows = {row.day: row.completion_tokens for row in recorder.pending()}
    assert rows == {date(2025, 5, 1): 9, date(2025, 5, 2): 6}
