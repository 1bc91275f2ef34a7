"""The peer bus at /metrics: who is heard, what was applied, lost and refused."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.peers.bus import PeerBus


class PeerBusCollector(Collector):
    def __init__(self, bus: PeerBus) -> None:
        self._bus = bus

    def collect(self) -> Iterator[Metric]:
        bus, picture = self._bus, self._bus.picture
        peers = picture.peers()
        heard = GaugeMetricFamily(
            "llmgw_peer_bus_peers",
            "Other gateway processes on the store, by whether their part of the picture is "
            "current (heard: snapshot taken, nothing lost since, not silent).",
            labels=["heard"],
        )
        heard.add_metric(["true"], sum(peers.values()))
        heard.add_metric(["false"], len(peers) - sum(peers.values()))
        yield heard
        counters = (
            ("llmgw_peer_bus_items_applied", "Items other gateways told.", picture.applied),
            ("llmgw_peer_bus_gaps", "Batches found lost (each asks for a snapshot).", picture.gaps),
            (
                "llmgw_peer_bus_malformed",
                "Signed items or snapshots this version did not understand.",
                picture.malformed,
            ),
            (
                "llmgw_peer_bus_refused",
                "Frames not signed with the cluster's key, or not peer bus messages.",
                bus.refused,
            ),
            ("llmgw_peer_bus_batches_sent", "Batches this gateway sent.", bus.sent_batches),
            (
                "llmgw_peer_bus_items_dropped",
                "Items dropped unsent because the outbox was full.",
                bus.outbox.dropped,
            ),
        )
        for name, text, value in counters:
            family = CounterMetricFamily(name, text)
            family.add_metric([], value)
            yield family
