"""Usage accounting off the request path: requests add to in-memory totals, a background loop
writes them to the store in one batch every second or so, and shutdown writes what is left."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from store import Store, UsageDelta


@dataclass
class _Counts:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


_Totals = dict[tuple[str, str, date], _Counts]


def _rows(totals: _Totals) -> list[UsageDelta]:
    return [
        UsageDelta(
            key_id=key_id,
            model=model,
            day=day,
            requests=c.requests,
            prompt_tokens=c.prompt_tokens,
            completion_tokens=c.completion_tokens,
        )
        for (key_id, model, day), c in totals.items()
    ]


class UsageRecorder:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._pending: _Totals = {}
        # Today (UTC) and the epoch seconds it spans: a request reads the clock once and
        # compares, instead of building a datetime (datetime.now(UTC).date() cost about as much
        # as the rest of `record`). A clock set back past midnight recomputes too.
        self._today = date.min
        self._today_from = 0.0
        self._today_until = 0.0

    def record(
        self,
        key_id: str,
        model: str,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        requests: int = 1,
        day: date | None = None,
    ) -> None:
        if day is None:
            now = time.time()
            if not self._today_from <= now < self._today_until:
                self._set_today(now)
            day = self._today
        key = (key_id, model, day)
        counts = self._pending.get(key)
        if counts is None:
            counts = self._pending[key] = _Counts()
        if requests > 0:
            counts.requests += requests
        if prompt_tokens > 0:
            counts.prompt_tokens += prompt_tokens
        if completion_tokens > 0:
            counts.completion_tokens += completion_tokens

    def _set_today(self, now: float) -> None:
        start = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        self._today = start.date()
        self._today_from = start.timestamp()
        self._today_until = (start + timedelta(days=1)).timestamp()

    def pending(self) -> list[UsageDelta]:
        return _rows(self._pending)

    async def flush(self) -> int:
        """Write what has accumulated; returns the number of rows written. If the store fails
        the deltas go back into the totals for the next try, so a store outage loses nothing."""
        batch, self._pending = self._pending, {}
        if not batch:
            return 0
        rows = _rows(batch)
        try:
            await self._store.add_usage(rows)
        except Exception:
            for row in rows:
                self.record(
                    row.key_id,
                    row.model,
                    row.prompt_tokens,
                    row.completion_tokens,
                    row.requests,
                    row.day,
                )
            raise
        return len(rows)
