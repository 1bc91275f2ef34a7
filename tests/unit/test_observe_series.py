"""The charts' buckets without a server: a ring that forgets what is an hour old, TTFT
percentiles from the histogram, the cached share, errors, the queue's depth and the bound on
series."""

from __future__ import annotations

import random

import pytest

from gateway.observe.record import RequestRecord
from gateway.observe.series import (
    BUCKET_S,
    BUCKETS,
    MAX_SERIES,
    OTHER,
    TTFT_RATIO,
    SeriesBook,
    histogram_percentile,
)

T0 = 1_700_000_000.0  # a bucket boundary


def record(
    at: float,
    model: str = "m",
    key: str = "k",
    status: int = 200,
    ttft: float | None = None,
    prompt: int = 10,
    completion: int = 5,
    cached: int | None = None,
) -> RequestRecord:
    r = RequestRecord("/v1/chat/completions")
    r.started_at, r.total_s = at, 0.0
    r.model, r.key_name, r.status, r.ttft_s = model, key, status, ttft
    r.prompt_tokens, r.completion_tokens, r.cached_tokens = prompt, completion, cached
    return r


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def test_percentiles_from_the_histogram_are_within_a_bin_of_the_samples() -> None:
    rng = random.Random(7)
    samples = [rng.lognormvariate(-1.5, 0.8) for _ in range(5000)]
    book = SeriesBook()
    for s in samples:
        book.add(record(0, ttft=s))
    bucket = book.everything.bucket(0)
    assert bucket.ttft is not None
    samples.sort()
    for q in (0.5, 0.99):
        exact = samples[int(q * len(samples)) - 1]
        found = histogram_percentile(bucket.ttft, q)
        assert found is not None
        assert exact / TTFT_RATIO <= found <= exact * TTFT_RATIO, (q, exact, found)
    assert histogram_percentile([0] * len(bucket.ttft), 0.5) is None


def test_a_bucket_counts_requests_errors_tokens_and_the_cached_share() -> None:
    clock = Clock()
    book = SeriesBook(clock)
    book.add(record(T0 + 1, ttft=0.1, cached=6))
    book.add(record(T0 + 2, status=502))
    book.add(record(T0 + 3, status=499))  # the client left: not an error
    columns = book.read("m", None, BUCKETS)
    assert columns is not None
    assert columns["t"][-1] == T0
    assert len(columns["t"]) == BUCKETS
    assert columns["requests_per_s"][-1] == pytest.approx(3 / BUCKET_S)
    assert columns["errors_per_s"][-1] == pytest.approx(1 / BUCKET_S)
    assert columns["completion_tokens_per_s"][-1] == pytest.approx(15 / BUCKET_S)
    # Only the request whose engine reported cached tokens counts toward the share.
    assert columns["cached_share"][-1] == pytest.approx(0.6)
    assert columns["ttft_p50_ms"][-1] == pytest.approx(100, rel=TTFT_RATIO - 1)
    assert columns["requests_per_s"][:-1] == [0] * (BUCKETS - 1)
    assert columns["ttft_p99_ms"][0] is None
    assert columns["queue_depth"][-1] is None


def test_the_ring_forgets_what_is_an_hour_old() -> None:
    clock = Clock()
    book = SeriesBook(clock)
    book.add(record(T0))
    clock.now = T0 + BUCKETS * BUCKET_S  # the same ring slot, an hour on
    book.add(record(clock.now))
    book.add(record(clock.now))
    columns = book.read("m", None, BUCKETS)
    assert columns is not None
    assert sum(columns["requests_per_s"]) * BUCKET_S == pytest.approx(2)
    last_minute = book.read(None, None, 6)
    assert last_minute is not None
    assert len(last_minute["t"]) == 6


def test_queue_samples_keep_the_most_waiting_per_model_and_key() -> None:
    clock = Clock()
    book = SeriesBook(clock)
    book.add(record(T0, model="quiet", key="idle"))
    book.sample_queue({"m": {("k", 1): 3, ("j", 2): 1}})
    book.sample_queue({"m": {("k", 1): 1}})

    def depth(model: str | None, key: str | None) -> list[int | None]:
        read = book.read(model, key, 1)
        assert read is not None
        found: list[int | None] = read["queue_depth"]
        return found

    assert depth(model="m", key=None) == [4]
    assert depth(model=None, key="k") == [3]
    assert depth(model="quiet", key=None) == [0], "nothing waiting is a sample too"
    assert depth(model=None, key=None) == [4]
    with pytest.raises(ValueError, match="one series"):
        book.read("m", "k", 1)
    assert book.read("nobody", None, 1) is None


def test_series_past_the_bound_are_counted_together() -> None:
    book = SeriesBook(Clock())
    for i in range(MAX_SERIES + 5):
        book.add(record(T0, model=f"m{i}"))
    assert len(book.models) == MAX_SERIES + 1
    other = book.read(OTHER, None, 1)
    assert other is not None
    assert other["requests_per_s"] == [5 / BUCKET_S]
    book.add(record(T0, model="never-charted"), chart_model=False)
    assert "never-charted" not in book.models
