"""Counters, histograms and a gauge for the request path, kept as plain numbers in dicts and
turned into Prometheus families only when /metrics is read.

prometheus_client's own metrics take a lock on every `inc` and `observe` (each value is a
MutexValue, and a histogram observation takes it once per bucket crossed): the request path paid
eight such locked updates per request, about 3% of the gateway's CPU in a profile of the plain
path (docs/benchmarks.md, Gateway). The request path runs on one thread, the event loop, so it
needs no lock; a scrape reads the dicts through `list(d.items())`, one C call that no update can
interleave with under the GIL. What a scrape sees is what the families always showed: each
counter's `_total`, each histogram's cumulative `_bucket`s, `_count` and `_sum` (no `_created`
samples, which nothing here read).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.core import Metric as Family
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

Labels = tuple[str, ...]


class PlainCounter(Collector):
    """A counter by label values: `inc(("a", "b"))`."""

    def __init__(
        self, name: str, documentation: str, labels: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self.name, self.documentation, self.labels = name, documentation, list(labels)
        self.values: dict[Labels, float] = {}
        registry.register(self)

    def inc(self, labels: Labels, amount: float = 1.0) -> None:
        values = self.values
        values[labels] = values.get(labels, 0.0) + amount

    def describe(self) -> Iterable[Family]:
        return [CounterMetricFamily(self.name, self.documentation, labels=self.labels)]

    def collect(self) -> Iterable[Family]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        for labels, value in list(self.values.items()):
            family.add_metric(list(labels), value)
        return [family]


class PlainHistogram(Collector):
    """A histogram by label values: `observe(("a",), 0.3)`. Each label set keeps one count per
    bucket (not cumulative: one increment per observation) and, last, the sum. Bounds are not
    negative (prometheus_client drops `_sum` from histograms that have one; this would not)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.name, self.documentation, self.labels = name, documentation, list(labels)
        self.bounds = [float(b) for b in buckets]
        if not self.bounds or self.bounds[0] < 0:
            raise ValueError(f"{name}: buckets must be given and not negative")
        # The `le` labels, written as prometheus_client writes them (0.25, 1.0, +Inf).
        self.le = [floatToGoString(b) for b in self.bounds]  # type: ignore[no-untyped-call]
        self.le.append("+Inf")
        self.values: dict[Labels, list[float]] = {}
        registry.register(self)

    def observe(self, labels: Labels, value: float) -> None:
        counts = self.values.get(labels)
        if counts is None:
            # One per bound, one for +Inf, then the sum.
            counts = self.values[labels] = [0.0] * (len(self.bounds) + 2)
        counts[bisect_left(self.bounds, value)] += 1  # a bound is inclusive (le)
        counts[-1] += value

    def describe(self) -> Iterable[Family]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labels)]

    def collect(self) -> Iterable[Family]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labels)
        for labels, counts in list(self.values.items()):
            counts = list(counts)
            cumulative, total = [], 0.0
            for name, count in zip(self.le, counts[:-1], strict=True):
                total += count
                cumulative.append((name, total))
            family.add_metric(list(labels), cumulative, counts[-1])
        return [family]


class PlainGauge(Collector):
    """A gauge without labels that the request path moves by whole steps."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self.name, self.documentation = name, documentation
        self.value = 0
        registry.register(self)

    def describe(self) -> Iterable[Family]:
        return [GaugeMetricFamily(self.name, self.documentation)]

    def collect(self) -> Iterable[Family]:
        return [GaugeMetricFamily(self.name, self.documentation, value=self.value)]
