"""The gateway's own figures for the console's routing page, read in process: replica choices
by model and reason (of which cache hits) and requests by status from its metrics registry, and
its fair queue from the admission gate (who waits for what, refusals, each replica's depth)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client.registry import CollectorRegistry

from gateway.admission import AdmissionGate
from store.models import PRIORITY_CLASSES

# Routing reasons that sent a request to a replica already holding its prompt's prefix (the
# KV-event index or the gateway's own prefix tree); `llmgw top` counts the same ones.
CACHE_REASONS = frozenset({"kv_prefix", "prefix"})


def routing_figures(registry: CollectorRegistry) -> dict[str, Any]:
    decisions: list[dict[str, Any]] = []
    requests: dict[tuple[str, str], float] = {}
    for family in registry.collect():
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "llmgw_routing_decisions_total":
                decisions.append(
                    {
                        "model": labels.get("model", ""),
                        "reason": labels.get("reason", ""),
                        "count": sample.value,
                        "cache_hit": labels.get("reason") in CACHE_REASONS,
                    }
                )
            elif sample.name == "llmgw_requests_total":
                key = (labels.get("model", ""), labels.get("status", ""))
                requests[key] = requests.get(key, 0.0) + sample.value
    decisions.sort(key=lambda d: (d["model"], d["reason"]))
    return {
        "decisions": decisions,
        "requests": [
            {"model": m, "status": s, "count": n} for (m, s), n in sorted(requests.items())
        ],
    }


def queue_figures(
    gate: AdmissionGate, registry: CollectorRegistry, model_of: Mapping[str, str]
) -> dict[str, Any]:
    """The fair queue now: per model and key, each class's requests waiting and how long the
    oldest has waited (highest class first); requests let through and not ended; refusals by
    reason since this gateway started; each replica's learnt depth (`model_of`: replica id ->
    its model, from the routing table)."""
    oldest = gate.oldest_waits()
    waiting = [
        {
            "model": model,
            "key": key,
            "priority": PRIORITY_CLASSES[priority],
            "waiting": count,
            "oldest_s": oldest.get(model, {}).get((key, priority)),
        }
        for model, places in sorted(gate.waiting().items())
        for (key, priority), count in sorted(places.items(), key=lambda p: (p[0][1], p[0][0]))
    ]
    refusals: list[dict[str, Any]] = []
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == "llmgw_queue_refusals_total":
                labels = sample.labels
                refusals.append(
                    {
                        "model": labels.get("model", ""),
                        "reason": labels.get("reason", ""),
                        "count": sample.value,
                    }
                )
    refusals.sort(key=lambda r: (r["model"], r["reason"]))
    return {
        "enabled": gate.enabled,
        "waiting": waiting,
        "admitted": [{"model": m, "requests": n} for m, n in sorted(gate.admitted().items())],
        "refusals": refusals,
        "depths": [
            {"replica": replica, "model": model_of.get(replica, ""), "depth": depth}
            for replica, depth in sorted(gate.depths.learnt().items())
        ],
    }
