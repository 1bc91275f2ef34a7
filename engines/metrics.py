"""What an engine is doing, from its own Prometheus metrics: requests running and waiting (for
the autoscaler, and for a stop that waits for in-flight requests so a drain drops nothing), and
the token counters that only move while it serves (for scale-to-zero)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import httpx

from workflows.contracts import ENGINE_FACTS, engine_facts

# Requests an engine is working on and holding in its queue, and the share of its KV cache in
# use, by the metric names each engine's row declares (workflows/contracts/engine_facts.py).
# One set for all: no two engines share a name, so a scrape matches only its own engine's.
_DECLARED = [row.metrics for row in ENGINE_FACTS.values() if row.metrics is not None]
RUNNING_METRICS = frozenset(m.running for m in _DECLARED)
WAITING_METRICS = frozenset(m.waiting for m in _DECLARED)
KV_USAGE_METRICS = frozenset(m.kv_usage for m in _DECLARED if m.kv_usage is not None)
DEFAULT_METRICS_PATH = "/metrics"


def metrics_path(engine: str) -> str:
    """Where `engine` serves its Prometheus text: its row's path, else the usual one."""
    known = engine_facts(engine)
    declared = known.metrics if known is not None else None
    return declared.path if declared is not None else DEFAULT_METRICS_PATH


@dataclass(frozen=True)
class Load:
    running: int
    waiting: int
    # Every *_tokens_total counter summed: it moves only while requests are served.
    work: float


def _samples(metrics_text: str) -> Iterator[tuple[str, float]]:
    for line in metrics_text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_and_labels, _, value = line.rpartition(" ")
        try:
            yield name_and_labels.split("{", 1)[0].strip(), float(value)
        except ValueError:
            continue


def load(metrics_text: str) -> Load | None:
    """The engine's load, or None when its metrics carry no request gauges (an engine started
    without metrics: nobody can tell)."""
    running = waiting = 0.0
    work = 0.0
    seen = False
    for name, value in _samples(metrics_text):
        if name in RUNNING_METRICS:
            running, seen = running + value, True
        elif name in WAITING_METRICS:
            waiting, seen = waiting + value, True
        elif name.endswith("tokens_total"):
            work += value
    return Load(int(running), int(waiting), work) if seen else None


def kv_usage(metrics_text: str) -> float | None:
    """The fullest KV cache's share in use (an engine with several data-parallel ranks reports
    one gauge each), or None when the engine exports none."""
    fullest: float | None = None
    for name, value in _samples(metrics_text):
        if name in KV_USAGE_METRICS and (fullest is None or value > fullest):
            fullest = value
    return fullest


# vLLM's cache configuration, as labels of a constant gauge: `num_gpu_blocks` is its cache's size.
_VLLM_CACHE_CONFIG = re.compile(r'^vllm:cache_config_info\{[^}]*\bnum_gpu_blocks="(\d+)"', re.M)


def kv_cache_blocks(metrics_text: str) -> int | None:
    """The engine's KV cache size in blocks (vLLM's `vllm:cache_config_info`), or None where
    its metrics do not say."""
    found = _VLLM_CACHE_CONFIG.search(metrics_text)
    return int(found.group(1)) if found else None


def totals(metrics_text: str, names: Iterable[str]) -> dict[str, float]:
    """Each named metric summed over its label sets (0 when absent): for counters such as
    llama.cpp's `llamacpp:prompt_tokens_cached_total`."""
    wanted = {name: 0.0 for name in names}
    for name, value in _samples(metrics_text):
        if name in wanted:
            wanted[name] += value
    return wanted


def in_flight(metrics_text: str) -> int | None:
    """Requests running or waiting, or None when the metrics do not say."""
    found = load(metrics_text)
    return None if found is None else found.running + found.waiting


async def scrape(metrics_url: str, engine_key: str, timeout_s: float = 2.0) -> Load | None:
    headers = {"Authorization": f"Bearer {engine_key}"}
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            response = await client.get(metrics_url, headers=headers)
    except httpx.HTTPError:
        return None
    return load(response.text) if response.status_code == 200 else None


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
