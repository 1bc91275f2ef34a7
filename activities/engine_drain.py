"""Waiting for an engine's in-flight requests to finish before it is stopped, so a drain or a
scale-down drops nothing. The engines' own metrics say what they are working on."""

from __future__ import annotations

import asyncio

import httpx

# Requests an engine is working on or holding in its queue, by the metric names each engine
# exports (../shared/REFERENCE.md, "Load and cache metrics by engine").
IN_FLIGHT_METRICS = frozenset(
    {
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "trtllm_num_requests_running",
        "trtllm_num_requests_waiting",
    }
)


def in_flight(metrics_text: str) -> int | None:
    """The sum of the in-flight gauges in Prometheus text, or None when it has none of them
    (an engine started without metrics: nobody can tell, so nobody should wait)."""
    total = 0.0
    seen = False
    for line in metrics_text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_and_labels, _, value = line.rpartition(" ")
        name = name_and_labels.split("{", 1)[0].strip()
        if name in IN_FLIGHT_METRICS:
            try:
                total += float(value)
            except ValueError:
                continue
            seen = True
    return int(total) if seen else None


async def wait_idle(
    metrics_url: str, engine_key: str, timeout_s: float, poll_s: float = 0.5
) -> str:
    """Poll until the engine reports nothing in flight twice in a row, or the timeout passes.
    Returns what happened, for the log."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    idle_polls = 0
    headers = {"Authorization": f"Bearer {engine_key}"}
    async with httpx.AsyncClient(timeout=2.0) as client:
        while loop.time() < deadline:
            try:
                response = await client.get(metrics_url, headers=headers)
            except httpx.HTTPError as err:
                return f"no metrics ({err.__class__.__name__}); stopping now"
            count = in_flight(response.text) if response.status_code == 200 else None
            if count is None:
                return f"no in-flight metrics (HTTP {response.status_code}); stopping now"
            idle_polls = idle_polls + 1 if count == 0 else 0
            if idle_polls >= 2:
                return "idle"
            await asyncio.sleep(poll_s)
    return f"still busy after {timeout_s:.0f}s; stopping anyway"
