"""The gateway's Prometheus metrics, served at /metrics.

One registry per app (tests build many apps in one process). What every request moves (its
count, duration, tokens, routing decision, the requests in flight) is kept in plain dicts
(gateway/plain_metrics.py): no lock and no label child per update. The rest are
prometheus_client's metrics, their label children looked up once per label set and kept:
`.labels()` takes a lock and formats a key.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable
from dataclasses import asdict
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.core import Metric as Family
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector
from typing_extensions import override

from gateway.kv.feeds import KvFeeds
from gateway.kv.publishers import KvPublishers
from gateway.plain_metrics import PlainCounter, PlainGauge, PlainHistogram
from gateway.routing.states import Expected, Routed, StateBook, StateChange
from gateway.store_health import StoreHealth

# Seconds: a gateway hop is sub-millisecond, a long completion is minutes.
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
Metric = TypeVar("Metric", Counter, Histogram)

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# Tokens, predicted minus reported: negative when the engine found more than predicted.
CACHE_ERROR_BUCKETS = (-4096, -1024, -256, -64, -16, -1, 0, 16, 64, 256, 1024, 4096)
TOKENIZE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)


class GatewayMetrics:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # Each model's recent routing states and cache checks, in memory (the console's window
        # and the state-change log: gateway/routing/states.py).
        self.routing_states = StateBook()
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._requests = PlainCounter(
            "llmgw_requests",
            "OpenAI requests answered, by model, endpoint and status code.",
            ["model", "endpoint", "status"],
            r,
        )
        self._latency = PlainHistogram(
            "llmgw_request_duration_seconds",
            "From the request's arrival to the end of its response.",
            ["model", "endpoint"],
            LATENCY_BUCKETS,
            r,
        )
        self._ttft = PlainHistogram(
            "llmgw_time_to_first_token_seconds",
            "Streamed requests: from arrival to the first content chunk sent.",
            ["model"],
            TTFT_BUCKETS,
            r,
        )
        self._tokens = PlainCounter(
            "llmgw_tokens", "Tokens accounted, by model and kind.", ["model", "kind"], r
        )
        self._upstream_errors = Counter(
            "llmgw_upstream_errors",
            "Failed upstream attempts, by model and reason.",
            ["model", "reason"],
            registry=r,
        )
        self._retries = Counter(
            "llmgw_retries",
            "Requests sent to another replica after a failure.",
            ["model"],
            registry=r,
        )
        self._routing = PlainCounter(
            "llmgw_routing_decisions",
            "Replica choices, by model and why (prefix, session, least_load, ...).",
            ["model", "reason"],
            r,
        )
        self._routing_state = PlainCounter(
            "llmgw_routing_state",
            "Replica choices, by model, how sure the choice was of the cache (exact, "
            "approximate, degraded, fallback) and why (docs/routing-states.md).",
            ["model", "state", "why"],
            r,
        )
        self._routing_predicted = Counter(
            "llmgw_routing_predicted",
            "Requests sent to a replica predicted to hold a prefix of their prompt whose engine "
            "reported its cached tokens, by model and routing state.",
            ["model", "state"],
            registry=r,
        )
        self._routing_incorrect = Counter(
            "llmgw_routing_incorrect",
            "Of llmgw_routing_predicted, those whose engine reported fewer than half the "
            "predicted cached tokens: the replica did not hold the prefix.",
            ["model", "state"],
            registry=r,
        )
        self._quota = Counter(
            "llmgw_quota_rejections", "Requests refused by a key's limits.", ["reason"], registry=r
        )
        self._auth = Counter(
            "llmgw_auth_failures",
            "Requests refused before a key was accepted (bad key, locked out).",
            ["reason"],
            registry=r,
        )
        self.in_flight = PlainGauge("llmgw_requests_in_flight", "Requests being proxied now.", r)
        self._tokenized = Counter(
            "llmgw_kv_tokenize",
            "Prompts sent to an engine's /tokenize for KV routing, by outcome "
            "(ok, skipped, timeout, failed; learned: not sent, the chat's leading messages "
            "known; new_prefix: not sent, a prefix this gateway never sent anywhere).",
            ["outcome"],
            registry=r,
        )
        self._tokenize_latency = Histogram(
            "llmgw_kv_tokenize_duration_seconds",
            "How long asking an engine for a prompt's token ids took.",
            buckets=TOKENIZE_BUCKETS,
            registry=r,
        )
        self._cache_error = Histogram(
            "llmgw_kv_predicted_cached_tokens_error",
            "Per request routed by KV events: predicted cached prompt tokens minus those the "
            "engine reported (usage.prompt_tokens_details.cached_tokens).",
            ["model"],
            buckets=CACHE_ERROR_BUCKETS,
            registry=r,
        )
        # prometheus-client leaves out a histogram's _sum when it has negative buckets: the
        # totals, for the overall ratio of reported to predicted, and the errors' sizes.
        self._cached_tokens = Counter(
            "llmgw_kv_cached_tokens",
            "Cached prompt tokens of requests routed by KV events, by model and kind "
            "(predicted by the gateway, reported by the engine; over: predicted and not "
            "found, under: found and not predicted).",
            ["model", "kind"],
            registry=r,
        )
        self._queue_wait = Histogram(
            "llmgw_queue_wait_seconds",
            "Time requests waited in the gateway's fair queue, by model and priority class "
            "(requests that passed at once are not counted).",
            ["model", "priority"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self._queue_refused = Counter(
            "llmgw_queue_refusals",
            "Requests the fair queue refused, by model and reason (queue_full: 429, "
            "queue_timeout: 503).",
            ["model", "reason"],
            registry=r,
        )
        self._children: dict[tuple[object, ...], Counter | Histogram] = {}

    def _child(self, metric: Metric, *labels: str) -> Metric:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child  # type: ignore[return-value]

    def request(self, model: str, endpoint: str, status: int, seconds: float) -> None:
        self._requests.inc((model, endpoint, str(status)))
        self._latency.observe((model, endpoint), seconds)

    def first_token(self, model: str, seconds: float) -> None:
        self._ttft.observe((model,), seconds)

    def tokens(self, model: str, prompt: int, completion: int) -> None:
        if prompt:
            self._tokens.inc((model, "prompt"), prompt)
        if completion:
            self._tokens.inc((model, "completion"), completion)

    def upstream_error(self, model: str, reason: str) -> None:
        self._child(self._upstream_errors, model, reason).inc()

    def retry(self, model: str) -> None:
        self._child(self._retries, model).inc()

    def routed(self, model: str, reason: str) -> None:
        self._routing.inc((model, reason))

    def routing_state(self, model: str, routed: Routed) -> StateChange | None:
        """Count a decision's state; the change of the model's routing state it makes, if
        any, for the caller to log."""
        self._routing_state.inc((model, routed.state, routed.why))
        return self.routing_states.note(model, routed, self._clock())

    def routing_checked(self, model: str, expected: Expected, reported: int) -> None:
        """The engine reported `reported` cached prompt tokens where `expected` was
        predicted."""
        incorrect = expected.incorrect(reported)
        self._child(self._routing_predicted, model, expected.state).inc()
        if incorrect:
            self._child(self._routing_incorrect, model, expected.state).inc()
        self.routing_states.checked(model, expected.state, incorrect, self._clock())

    def routing_view(self) -> list[dict[str, Any]]:
        """Each model's routing states over the recent window, for the console."""
        return self.routing_states.view(self._clock())

    def quota_rejected(self, reason: str) -> None:
        self._child(self._quota, reason).inc()

    def auth_failed(self, reason: str) -> None:
        self._child(self._auth, reason).inc()

    def kv_tokenized(self, outcome: str, seconds: float) -> None:
        self._child(self._tokenized, outcome).inc()
        if outcome not in ("skipped", "learned", "new_prefix"):  # an engine was asked
            self._tokenize_latency.observe(seconds)

    def kv_cache_error(self, model: str, predicted: int, reported: int) -> None:
        self._child(self._cache_error, model).observe(predicted - reported)
        self._child(self._cached_tokens, model, "predicted").inc(predicted)
        self._child(self._cached_tokens, model, "reported").inc(reported)
        # Their sum over requests is the exact mean |error|, which the histogram only bounds.
        self._child(self._cached_tokens, model, "over").inc(max(predicted - reported, 0))
        self._child(self._cached_tokens, model, "under").inc(max(reported - predicted, 0))

    def queue_waited(self, model: str, priority: str, seconds: float) -> None:
        self._child(self._queue_wait, model, priority).observe(seconds)

    def queue_refused(self, model: str, reason: str) -> None:
        self._child(self._queue_refused, model, reason).inc()

    def watch_kv(self, feeds: KvFeeds, publishers: KvPublishers | None = None) -> None:
        """Expose the KV feeds' and external publishers' counters and the index's size, read
        at each scrape."""
        self.registry.register(_KvCollector(feeds))
        if publishers is not None:
            self.registry.register(_KvPublisherCollector(publishers))

    def watch_store(self, health: StoreHealth) -> None:
        """Expose whether the store answers, for how long it has not, and the requests
        refused for want of it, read at each scrape."""
        self.registry.register(_StoreCollector(health))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


# FeedCounters field -> (metric name, help): counters by node, read from the readers' own
# counts when scraped, so the hot path keeps plain integers.
_FEED_COUNTERS = {
    "lines": ("llmgw_kv_feed_lines", "KV feed lines received, by node."),
    "malformed": ("llmgw_kv_feed_malformed", "KV feed lines that were not feed messages."),
    "gaps": ("llmgw_kv_feed_gaps", "KV feed sequence gaps (then a reset and a new snapshot)."),
    "snapshots": ("llmgw_kv_feed_snapshots", "KV feed snapshots begun."),
    "resets": ("llmgw_kv_feed_resets", "Times a KV feed's replicas were dropped (feed trouble)."),
    "replica_resets": ("llmgw_kv_feed_replica_resets", "KV feed lines resetting a replica."),
    "reconnects": ("llmgw_kv_feed_reconnects", "KV feed connections after the first."),
    "refused": ("llmgw_kv_feed_refused", "KV feed connections refused (401/403)."),
    "failures": ("llmgw_kv_feed_failures", "KV feed connections that failed or ended."),
    "quiet": ("llmgw_kv_feed_quiet", "KV feed connections dropped for silence."),
    "foreign": ("llmgw_kv_feed_foreign", "KV feed lines about another node's replica."),
}


class _FamiliesCollector(Collector):
    """A collector whose families are built in one place: without samples to describe them,
    with samples to collect them."""

    def describe(self) -> Iterable[Family]:
        return self._families(with_samples=False)

    def collect(self) -> Iterable[Family]:
        return self._families(with_samples=True)

    def _families(self, with_samples: bool) -> list[Family]:
        raise NotImplementedError


class _KvCollector(_FamiliesCollector):
    def __init__(self, feeds: KvFeeds) -> None:
        self._feeds = feeds

    @override
    def _families(self, with_samples: bool) -> list[Family]:
        counters = {
            name: CounterMetricFamily(metric, text, labels=["node"])
            for name, (metric, text) in _FEED_COUNTERS.items()
        }
        connected = GaugeMetricFamily(
            "llmgw_kv_feed_connected", "1 while a KV feed is live, by node.", labels=["node"]
        )
        blocks = GaugeMetricFamily(
            "llmgw_kv_index_blocks", "Blocks the gateway holds per replica.", labels=["replica"]
        )
        if with_samples:
            feeds = self._feeds
            # By node: a node whose feed moved to another address has counts under both.
            by_node: dict[str, Tally[str]] = {}
            for (_, node), counts in feeds.counters().items():
                by_node.setdefault(node, Tally()).update(asdict(counts))
            for node, tally in sorted(by_node.items()):
                for name, family in counters.items():
                    family.add_metric([node], tally[name])
            live: dict[str, bool] = {}
            for reader in feeds.readers():
                live[reader.node] = live.get(reader.node, False) or reader.live
            for node, is_live in sorted(live.items()):
                connected.add_metric([node], 1.0 if is_live else 0.0)
            for replica_id in feeds.index.replicas():
                blocks.add_metric([replica_id], feeds.index.size(replica_id))
        return [*counters.values(), connected, blocks]


# PublisherCounters field -> help: counters by publisher endpoint (gateway/kv/publishers.py),
# named llmgw_kv_publisher_<field>_total.
_PUBLISHER_COUNTERS = {
    "received": "KV-event batches received from an external engine's publisher.",
    "malformed": "KV-event messages that could not be decoded.",
    "duplicates": "KV-event batches heard twice (a replay overlapping the stream).",
    "unknown": "KV-event batches with an event of an unknown kind (then a reset).",
    "gaps": "KV-event sequence gaps.",
    "replays": "KV-event replays asked for, to fill a gap.",
    "resets": "Times an external engine's blocks were forgotten.",
    "connects": "Connections made to an external engine's publisher.",
    "disconnects": "Connections to an external engine's publisher lost (then a reset).",
    "failures": "Subscribers to an external engine's publisher that failed and were restarted.",
}


class _KvPublisherCollector(_FamiliesCollector):
    def __init__(self, publishers: KvPublishers) -> None:
        self._publishers = publishers

    @override
    def _families(self, with_samples: bool) -> list[Family]:
        counters = {
            name: CounterMetricFamily(f"llmgw_kv_publisher_{name}", text, labels=["publisher"])
            for name, text in _PUBLISHER_COUNTERS.items()
        }
        connected = GaugeMetricFamily(
            "llmgw_kv_publisher_connected",
            "1 while connected to an external engine's KV-event publisher.",
            labels=["publisher"],
        )
        if with_samples:
            # By endpoint: subscriptions to one publisher under two topics add up.
            by_publisher: dict[str, Tally[str]] = {}
            for (publisher, _, _), counts in self._publishers.counters().items():
                by_publisher.setdefault(publisher, Tally()).update(asdict(counts))
            for publisher, tally in sorted(by_publisher.items()):
                for name, family in counters.items():
                    family.add_metric([publisher], tally[name])
            live: dict[str, bool] = {}
            for subscription in self._publishers.subscriptions():
                publisher = subscription.key[0]
                live[publisher] = live.get(publisher, False) or subscription.connected
            for publisher, is_live in sorted(live.items()):
                connected.add_metric([publisher], 1.0 if is_live else 0.0)
        return [*counters.values(), connected]


class _StoreCollector(_FamiliesCollector):
    def __init__(self, health: StoreHealth) -> None:
        self._health = health

    @override
    def _families(self, with_samples: bool) -> list[Family]:
        health = self._health
        reachable = GaugeMetricFamily(
            "llmgw_store_reachable",
            "1 while the gateway's last store call succeeded, 0 while it cannot reach it.",
        )
        down = GaugeMetricFamily(
            "llmgw_store_unreachable_seconds",
            "Seconds since the store stopped answering (0 when it answers); past the outage "
            "grace the gateway refuses every request.",
        )
        refused = CounterMetricFamily(
            "llmgw_store_outage_refusals",
            "Requests refused because the store could not be reached.",
        )
        if with_samples:
            reachable.add_metric([], 1 if health.reachable else 0)
            down.add_metric([], health.down_for())
            refused.add_metric([], health.refusals)
        return [reachable, down, refused]
