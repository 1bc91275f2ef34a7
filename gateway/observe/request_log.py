"""The last N proxied requests this gateway process served, newest first on reading, and the
filters an operator reads them with (GET /admin/v1/requests, the console's Requests page).

A bounded deque: adding is an append that drops the oldest once full, so the log costs the
request path one append and its memory is N records (each a few hundred bytes, plus a logged
prompt's PROMPT_CHARS where a key logs them). Each process of a `--workers N` gateway keeps its
own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from gateway.observe.record import RequestRecord
from gateway.observe.series import SeriesBook

STATUS_CLASSES = ("2xx", "3xx", "4xx", "5xx")


class BadFilter(ValueError):
    """A filter the log cannot apply; its message says which and why."""


@dataclass(frozen=True)
class RequestFilter:
    """What to show: every field given must match (None: any)."""

    model: str | None = None
    key: str | None = None  # the key's id or its name
    status_class: str | None = None  # "2xx", "4xx"...
    replica: str | None = None
    min_ttft_s: float | None = None  # streams that took at least this long to a first token
    request_id: str | None = None  # the x-request-id the client was given

    def __post_init__(self) -> None:
        if self.status_class is not None and self.status_class not in STATUS_CLASSES:
            raise BadFilter(f"status must be one of {', '.join(STATUS_CLASSES)}")
        if self.min_ttft_s is not None and not self.min_ttft_s >= 0:
            raise BadFilter("min_ttft_ms must be a number of milliseconds, 0 or more")

    def matches(self, record: RequestRecord) -> bool:
        if self.request_id is not None and record.request_id != self.request_id:
            return False
        if self.model is not None and record.model != self.model:
            return False
        if self.key is not None and self.key not in (record.key_id, record.key_name):
            return False
        if self.status_class is not None and record.status // 100 != int(self.status_class[0]):
            return False
        if self.replica is not None and record.replica != self.replica:
            return False
        return self.min_ttft_s is None or (
            record.ttft_s is not None and record.ttft_s >= self.min_ttft_s
        )


def newest_matching(
    records: Iterable[RequestRecord], wanted: RequestFilter, limit: int
) -> Iterator[RequestRecord]:
    """At most `limit` records that match, in the order given."""
    if limit <= 0:
        return
    for record in records:
        if wanted.matches(record):
            yield record
            limit -= 1
            if limit == 0:
                return


class RequestLog:
    """The last `size` requests, and the series the same records feed (series.py)."""

    def __init__(self, size: int, series: SeriesBook | None = None) -> None:
        if size < 1:
            raise ValueError("a request log holds at least one request")
        self.size = size
        self._records: deque[RequestRecord] = deque(maxlen=size)
        self.series = series if series is not None else SeriesBook()

    def add(self, record: RequestRecord, chart_model: bool = True) -> None:
        """`chart_model`: the model is known to exist, so it may have a series of its own."""
        self._records.append(record)
        self.series.add(record, chart_model)

    def __len__(self) -> int:
        return len(self._records)

    def query(self, wanted: RequestFilter, limit: int) -> list[RequestRecord]:
        """The newest `limit` records that match, newest first."""
        return list(newest_matching(reversed(self._records), wanted, limit))

    def seen(self) -> tuple[list[str], list[str], list[str]]:
        """The models, key names and replicas the log holds now: what the filters offer."""
        models = {r.model for r in self._records if r.model}
        keys = {r.key_name for r in self._records if r.key_name}
        replicas = {r.replica for r in self._records if r.replica}
        return sorted(models), sorted(keys), sorted(replicas)
