"""Usage accounting off the request path: requests add to in-memory totals, a background loop
writes them to the store in one batch every second or so, and shutdown writes what is left."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime

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

    def record(
        self,
        key_id: str,
        model: str,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        requests: int = 1,
        day: date | None = None,
    ) -> None:
        day = day or datetime.now(UTC).date()
        counts = self._pending.setdefault((key_id, model, day), _Counts())
        counts.requests += max(requests, 0)
        counts.prompt_tokens += max(prompt_tokens, 0)
        counts.completion_tokens += max(completion_tokens, 0)

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
