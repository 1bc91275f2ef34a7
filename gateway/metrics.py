"""The gateway's Prometheus metrics, served at /metrics.

One registry per app (tests build many apps in one process). Label children are looked up once
per (model, endpoint) and kept: `.labels()` takes a lock and formats a key, which the hot path
should not pay on every request.
"""

from __future__ import annotations

from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

# Seconds: a gateway hop is sub-millisecond, a long completion is minutes.
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
Metric = TypeVar("Metric", Counter, Histogram)

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._requests = Counter(
            "llmgw_requests",
            "OpenAI requests answered, by model, endpoint and status code.",
            ["model", "endpoint", "status"],
            registry=r,
        )
        self._latency = Histogram(
            "llmgw_request_duration_seconds",
            "From the request's arrival to the end of its response.",
            ["model", "endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._ttft = Histogram(
            "llmgw_time_to_first_token_seconds",
            "Streamed requests: from arrival to the first content chunk sent.",
            ["model"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self._tokens = Counter(
            "llmgw_tokens", "Tokens accounted, by model and kind.", ["model", "kind"], registry=r
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
        self._routing = Counter(
            "llmgw_routing_decisions",
            "Replica choices, by model and why (prefix, session, least_load, ...).",
            ["model", "reason"],
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
        self.in_flight = Gauge(
            "llmgw_requests_in_flight", "Requests being proxied now.", registry=r
        )
        self._children: dict[tuple[object, ...], Counter | Histogram] = {}

    def _child(self, metric: Metric, *labels: str) -> Metric:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child  # type: ignore[return-value]

    def request(self, model: str, endpoint: str, status: int, seconds: float) -> None:
        self._child(self._requests, model, endpoint, str(status)).inc()
        self._child(self._latency, model, endpoint).observe(seconds)

    def first_token(self, model: str, seconds: float) -> None:
        self._child(self._ttft, model).observe(seconds)

    def tokens(self, model: str, prompt: int, completion: int) -> None:
        if prompt:
            self._child(self._tokens, model, "prompt").inc(prompt)
        if completion:
            self._child(self._tokens, model, "completion").inc(completion)

    def upstream_error(self, model: str, reason: str) -> None:
        self._child(self._upstream_errors, model, reason).inc()

    def retry(self, model: str) -> None:
        self._child(self._retries, model).inc()

    def routed(self, model: str, reason: str) -> None:
        self._child(self._routing, model, reason).inc()

    def quota_rejected(self, reason: str) -> None:
        self._child(self._quota, reason).inc()

    def auth_failed(self, reason: str) -> None:
        self._child(self._auth, reason).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
