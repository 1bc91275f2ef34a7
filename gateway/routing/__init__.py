"""Routing: which replica serves a request. `snapshot` is the routing table as the gateway sees
it, `policy.Router` the choice (prefix affinity, sessions, load), `prefix_index` what each
replica has cached, `breaker` which replicas to avoid, `loads` what the engines report."""

from gateway.routing.breaker import BreakerState, CircuitBreaker
from gateway.routing.decisions import REASONS, Decision, OverloadMargin, Reason, Sent
from gateway.routing.loads import EngineLoadBoard, LoadSample, ScrapeRound, scrape_all
from gateway.routing.policy import Router
from gateway.routing.prefix_index import PrefixIndex
from gateway.routing.request_key import RequestKey, prompt_bytes
from gateway.routing.snapshot import RoutingSnapshot

__all__ = [
    "REASONS",
    "BreakerState",
    "CircuitBreaker",
    "Decision",
    "EngineLoadBoard",
    "LoadSample",
    "OverloadMargin",
    "PrefixIndex",
    "Reason",
    "RequestKey",
    "Router",
    "RoutingSnapshot",
    "ScrapeRound",
    "Sent",
    "prompt_bytes",
    "scrape_all",
]
