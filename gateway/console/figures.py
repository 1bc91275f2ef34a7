"""The gateway's own figures for the console's routing page, read from its metrics registry in
process: replica choices by model and reason (of which cache hits), and requests by status."""

from __future__ import annotations

from typing import Any

from prometheus_client.registry import CollectorRegistry

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
