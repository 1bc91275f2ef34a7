"""Figures over time, per model and per key: requests, errors, TTFT percentiles, tokens, the
cached share of prompts and the fair queue's depth, in fixed time buckets (BUCKET_S seconds,
the last BUCKETS of them: an hour), fed by each request's RequestRecord where it ends and by a
periodic sample of the queue (gateway/app.py).

Bounded: a ring of BUCKETS slots per series, a slot reused once its bucket is an hour old, at
most MAX_SERIES models and as many keys (later ones are counted under OTHER), and TTFT kept as
a histogram of TTFT_BOUNDS, not the samples: a percentile is read from it to within the bins'
ratio (TTFT_RATIO, interpolated inside the bin). Each process of a `--workers N` gateway keeps
its own.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Mapping
from typing import Any

from gateway.observe.record import RequestRecord

BUCKET_S = 10
BUCKETS = 360
# TTFT bins: upper bounds from 1 ms growing by TTFT_RATIO, up to about 3 minutes; slower ones
# count in the last bin.
TTFT_RATIO = 1.4
TTFT_BOUNDS = tuple(0.001 * TTFT_RATIO**i for i in range(37))
_LAST_BIN = len(TTFT_BOUNDS) - 1  # where slower ones count
MAX_SERIES = 200
# The series every model (or key) past MAX_SERIES is counted in.
OTHER = "(other)"
# A client that closed its request (nginx's 499) is not the gateway's or the engine's error.
CLIENT_CLOSED = 499


class Bucket:
    """One BUCKET_S interval of one series, counted by SeriesBook.add."""

    __slots__ = (
        "cached_prompt_tokens",
        "cached_tokens",
        "completion_tokens",
        "errors",
        "index",
        "prompt_tokens",
        "queue_depth",
        "requests",
        "ttft",
    )

    def __init__(self, index: int) -> None:
        self.index = index  # the bucket's start, in BUCKET_S since the epoch
        self.requests = 0
        self.errors = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        # Of the requests whose engine reported cached tokens: those, and their prompts.
        self.cached_tokens = 0
        self.cached_prompt_tokens = 0
        self.ttft: list[int] | None = None  # counts per TTFT_BOUNDS bin, once one came
        self.queue_depth: int | None = None  # the most requests waiting, of the samples taken

    def depth(self, waiting: int) -> None:
        self.queue_depth = waiting if self.queue_depth is None else max(self.queue_depth, waiting)


def histogram_percentile(counts: list[int], q: float) -> float | None:
    """The q-th quantile (0 < q <= 1) of a TTFT_BOUNDS histogram, in seconds, interpolated
    geometrically inside its bin; None with no samples."""
    total = sum(counts)
    if total == 0:
        return None
    target = q * total
    seen = 0
    for i, count in enumerate(counts):
        if count and seen + count >= target:
            upper = TTFT_BOUNDS[i]
            lower = upper / TTFT_RATIO
            fraction = (target - seen) / count
            return float(lower * TTFT_RATIO**fraction)
        seen += count
    return TTFT_BOUNDS[-1]


class TimeSeries:
    """The last BUCKETS buckets of one model, one key, or everything."""

    __slots__ = ("_ring",)

    def __init__(self) -> None:
        self._ring: list[Bucket | None] = [None] * BUCKETS

    def bucket(self, at: float) -> Bucket:
        index = int(at // BUCKET_S)
        slot = index % BUCKETS
        found = self._ring[slot]
        if found is None or found.index != index:
            found = self._ring[slot] = Bucket(index)
        return found

    def window(self, now: float, buckets: int = BUCKETS) -> list[Bucket | None]:
        """The last `buckets` buckets up to now's, oldest first; None where nothing came."""
        last = int(now // BUCKET_S)
        out: list[Bucket | None] = []
        for index in range(last - buckets + 1, last + 1):
            found = self._ring[index % BUCKETS]
            out.append(found if found is not None and found.index == index else None)
        return out


def columns(series: TimeSeries, now: float, buckets: int = BUCKETS) -> dict[str, Any]:
    """The series as the console draws it: one list per figure, a value per bucket, oldest
    first (null where a figure has nothing to say: no stream, no cached tokens reported, no
    queue sample)."""
    last = int(now // BUCKET_S)
    out: dict[str, list[Any]] = {
        "t": [(last - buckets + 1 + i) * BUCKET_S for i in range(buckets)],
        "requests_per_s": [],
        "errors_per_s": [],
        "ttft_p50_ms": [],
        "ttft_p99_ms": [],
        "prompt_tokens_per_s": [],
        "completion_tokens_per_s": [],
        "cached_share": [],
        "queue_depth": [],
    }
    for bucket in series.window(now, buckets):
        if bucket is None:
            for name in ("requests_per_s", "errors_per_s"):
                out[name].append(0)
            for name in ("prompt_tokens_per_s", "completion_tokens_per_s"):
                out[name].append(0)
            for name in ("ttft_p50_ms", "ttft_p99_ms", "cached_share", "queue_depth"):
                out[name].append(None)
            continue
        out["requests_per_s"].append(bucket.requests / BUCKET_S)
        out["errors_per_s"].append(bucket.errors / BUCKET_S)
        out["prompt_tokens_per_s"].append(bucket.prompt_tokens / BUCKET_S)
        out["completion_tokens_per_s"].append(bucket.completion_tokens / BUCKET_S)
        for name, q in (("ttft_p50_ms", 0.5), ("ttft_p99_ms", 0.99)):
            value = histogram_percentile(bucket.ttft, q) if bucket.ttft else None
            out[name].append(None if value is None else round(value * 1000, 1))
        out["cached_share"].append(
            bucket.cached_tokens / bucket.cached_prompt_tokens
            if bucket.cached_prompt_tokens
            else None
        )
        out["queue_depth"].append(bucket.queue_depth)
    return out


class SeriesBook:
    """Every series: all requests, each model's, each key's (by name)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self.everything = TimeSeries()
        self.models: dict[str, TimeSeries] = {}
        self.keys: dict[str, TimeSeries] = {}

    @staticmethod
    def _of(book: dict[str, TimeSeries], name: str) -> TimeSeries:
        found = book.get(name)
        if found is None:
            if len(book) >= MAX_SERIES:
                name = OTHER
                found = book.get(name)
            if found is None:
                found = book[name] = TimeSeries()
        return found

    def add(self, record: RequestRecord, chart_model: bool = True) -> None:
        """Count one request in everything's series, its model's (where `chart_model`) and its
        key's, in the bucket of when it ended. Every request ends here: the record is read and
        its bucket's index and TTFT bin worked out once for the three."""
        index = int((record.started_at + record.total_s) // BUCKET_S)
        slot = index % BUCKETS
        status = record.status
        error = status >= 400 and status != CLIENT_CLOSED
        prompt = record.prompt_tokens or 0
        completion = record.completion_tokens or 0
        cached = record.cached_tokens
        ttft = record.ttft_s
        ttft_bin = -1 if ttft is None else min(bisect.bisect_left(TTFT_BOUNDS, ttft), _LAST_BIN)
        model = record.model if chart_model else None
        key = record.key_name
        for series in (
            self.everything,
            None if model is None else self._of(self.models, model),
            None if key is None else self._of(self.keys, key),
        ):
            if series is None:
                continue
            ring = series._ring
            bucket = ring[slot]
            if bucket is None or bucket.index != index:
                bucket = ring[slot] = Bucket(index)
            bucket.requests += 1
            if error:
                bucket.errors += 1
            bucket.prompt_tokens += prompt
            bucket.completion_tokens += completion
            if cached is not None:
                bucket.cached_tokens += cached
                bucket.cached_prompt_tokens += prompt
            if ttft_bin >= 0:
                if bucket.ttft is None:
                    bucket.ttft = [0] * len(TTFT_BOUNDS)
                bucket.ttft[ttft_bin] += 1

    def sample_queue(self, waiting: Mapping[str, Mapping[tuple[str, int], int]]) -> None:
        """The fair queue now (AdmissionGate.waiting(): model -> (key name, class) -> count):
        each series' bucket keeps the most it has seen waiting. Series with nothing waiting get
        0, so a chart tells an empty queue from no sample."""
        at = self._clock()
        per_key: dict[str, int] = {}
        total = 0
        for places in waiting.values():
            for (key, _), count in places.items():
                per_key[key] = per_key.get(key, 0) + count
                total += count
        self.everything.bucket(at).depth(total)
        for model in waiting.keys() | self.models.keys():
            depth = sum(waiting.get(model, {}).values())
            self._of(self.models, model).bucket(at).depth(depth)
        for key in per_key.keys() | self.keys.keys():
            self._of(self.keys, key).bucket(at).depth(per_key.get(key, 0))

    def read(self, model: str | None, key: str | None, buckets: int) -> dict[str, Any] | None:
        """One series' columns (a model's, a key's, or everything's); None for one unknown."""
        if model is not None and key is not None:
            raise ValueError("one series at a time: a model or a key")
        series: TimeSeries | None = self.everything
        if model is not None:
            series = self.models.get(model)
        elif key is not None:
            series = self.keys.get(key)
        if series is None:
            return None
        return columns(series, self._clock(), buckets)
