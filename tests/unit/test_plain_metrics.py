"""The request path's lock-free metrics (gateway/plain_metrics.py) expose exactly what
prometheus_client's own Counter, Histogram and Gauge expose for the same updates (less the
`_created` samples), so dashboards and alerts read them unchanged."""

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import LATENCY_BUCKETS
from gateway.plain_metrics import PlainCounter, PlainGauge, PlainHistogram


def exposed(registry: CollectorRegistry) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    return {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_each_exposes_what_prometheus_clients_own_metric_would() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    counter = Counter("llmgw_requests", "Requests.", ["model", "status"], registry=theirs)
    histogram = Histogram(
        "llmgw_request_duration_seconds",
        "Time.",
        ["model"],
        buckets=LATENCY_BUCKETS,
        registry=theirs,
    )
    gauge = Gauge("llmgw_requests_in_flight", "Now.", registry=theirs)
    plain_counter = PlainCounter("llmgw_requests", "Requests.", ["model", "status"], ours)
    plain_histogram = PlainHistogram(
        "llmgw_request_duration_seconds", "Time.", ["model"], LATENCY_BUCKETS, ours
    )
    plain_gauge = PlainGauge("llmgw_requests_in_flight", "Now.", ours)

    # Values on bucket bounds (a bound is inclusive), between them, past the last, and zero.
    for model, seconds in [
        ("a", 0.001),
        ("a", 0.0011),
        ("b", 0.0),
        ("a", 300.0),
        ("b", 999.0),
        ("a", 0.3),
        ("b", 0.3),
    ]:
        histogram.labels(model).observe(seconds)
        plain_histogram.observe((model,), seconds)
    for model, status, amount in [("a", "200", 1), ("a", "200", 5), ("b", "429", 1)]:
        counter.labels(model, status).inc(amount)
        plain_counter.inc((model, status), amount)
    gauge.inc()
    gauge.inc()
    gauge.dec()
    plain_gauge.value += 2
    plain_gauge.value -= 1

    assert exposed(ours) == exposed(theirs)
    assert ("llmgw_requests_total", (("model", "a"), ("status", "200")), 6.0) in exposed(ours)


def test_a_histogram_with_a_negative_bucket_is_refused() -> None:
    # prometheus_client leaves `_sum` out of such a histogram; this one would not, so it is
    # not used for them (gateway/metrics.py keeps prometheus_client's there).
    with pytest.raises(ValueError, match="not negative"):
        PlainHistogram("x", "X.", [], [-1.0, 0.0], CollectorRegistry())
