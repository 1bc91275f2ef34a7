"""The fair queue as Prometheus sees it, read from the gate at each scrape: who waits for what
and for how long, how many requests each model has admitted, and the depth learnt for each
replica."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.core import Metric as Family
from prometheus_client.registry import Collector

from gateway.admission.gate import AdmissionGate
from store.models import PRIORITY_CLASSES


class AdmissionCollector(Collector):
    def __init__(self, gate: AdmissionGate) -> None:
        self._gate = gate

    def describe(self) -> Iterable[Family]:
        return self._families(with_samples=False)

    def collect(self) -> Iterable[Family]:
        return self._families(with_samples=True)

    def _families(self, with_samples: bool) -> list[Family]:
        waiting = GaugeMetricFamily(
            "llmgw_queue_waiting",
            "Requests waiting in the gateway's fair queue, by model, key and priority class.",
            labels=["model", "key", "priority"],
        )
        oldest = GaugeMetricFamily(
            "llmgw_queue_oldest_wait_seconds",
            "How long the longest-waiting request in the gateway's fair queue has waited so far, "
            "by model, key and priority class.",
            labels=["model", "key", "priority"],
        )
        admitted = GaugeMetricFamily(
            "llmgw_queue_admitted",
            "Requests the fair queue let through that have not ended, by model.",
            labels=["model"],
        )
        depth = GaugeMetricFamily(
            "llmgw_replica_depth",
            "The requests this gateway sends a replica at once, learnt from its engine's "
            "running and waiting gauges.",
            labels=["replica"],
        )
        if with_samples:
            for model, places in sorted(self._gate.waiting().items()):
                for (key, priority), count in sorted(places.items()):
                    waiting.add_metric([model, key, PRIORITY_CLASSES[priority]], count)
            for model, waits in sorted(self._gate.oldest_waits().items()):
                for (key, priority), seconds in sorted(waits.items()):
                    oldest.add_metric([model, key, PRIORITY_CLASSES[priority]], seconds)
            for model, count in sorted(self._gate.admitted().items()):
                admitted.add_metric([model], count)
            for replica, learnt in sorted(self._gate.depths.learnt().items()):
                depth.add_metric([replica], learnt)
        return [waiting, oldest, admitted, depth]
