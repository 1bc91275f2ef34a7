"""The node agents' GPU telemetry and engine load as the CLI reads them: each agent's
Prometheus `/metrics` (activities/agent/node_metrics.py), at the URL its inventory names.

The figures are read from the agents, not carried through Temporal: they change every second,
and every heartbeat is an event in the node workflow's history, so carrying them there would
grow history with each beat. The ledger holds only the URL, which changes when the agent
restarts. `llmgw nodes` and `llmgw top` ask each agent directly; an agent they cannot reach
(its metrics bound to its own loopback, on another machine) shows no figures and says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

# An agent that does not answer within this long is reported as unreachable: the CLI asks
# every agent at once, so one slow agent costs one timeout, not one per node.
READ_TIMEOUT_S = 1.5
_GIB = 1024**3


@dataclass
class GpuFigures:
    index: int
    name: str = ""
    parent: int | None = None  # the card, for a MIG instance
    utilization_pct: float | None = None
    memory_used: float | None = None  # bytes
    memory_total: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    ecc_uncorrected: float | None = None
    remap_pending: bool = False
    throttled: list[str] = field(default_factory=list)  # reasons active now, gpu_idle aside
    # Its multi-node NVLink fabric (llmgw_gpu_nvlink_fabric_*); None: outside any fabric, or
    # an agent from before these were exported.
    fabric_joined: bool | None = None
    fabric_degraded: bool | None = None


@dataclass
class EngineFigures:
    replica: str
    engine: str = ""
    up: bool = False
    running: float = 0.0
    waiting: float = 0.0
    tokens: float = 0.0
    rss_bytes: float | None = None  # None: not measured
    gpu_memory_bytes: float | None = None  # None: no GPUs


@dataclass
class NodeTelemetry:
    node: str
    source: str = "none"  # nvml, nvidia-smi, none
    gpus: list[GpuFigures] = field(default_factory=list)
    engines: list[EngineFigures] = field(default_factory=list)
    # nvidia-imex (llmgw_node_imex_*); None where the agent exports none (no IMEX, no fabric).
    imex_up: bool | None = None
    imex_channels: int | None = None

    def cards(self) -> list[GpuFigures]:
        return [g for g in self.gpus if g.parent is None]


_GPU_VALUES = {
    "llmgw_gpu_utilization_percent": "utilization_pct",
    "llmgw_gpu_memory_used_bytes": "memory_used",
    "llmgw_gpu_memory_total_bytes": "memory_total",
    "llmgw_gpu_temperature_celsius": "temperature_c",
    "llmgw_gpu_power_watts": "power_w",
    "llmgw_gpu_power_limit_watts": "power_limit_w",
}
_ENGINE_VALUES = {
    "llmgw_node_engine_requests_running": "running",
    "llmgw_node_engine_requests_waiting": "waiting",
    "llmgw_node_engine_tokens_total": "tokens",
    "llmgw_node_engine_memory_rss_bytes": "rss_bytes",
    "llmgw_node_engine_gpu_memory_bytes": "gpu_memory_bytes",
}


def parse_agent_metrics(text: str, node: str) -> NodeTelemetry | None:
    """This node's figures from an agent's /metrics; None when the page is not that node's
    agent (a loopback URL reached from another machine finds whatever listens there)."""
    telemetry: NodeTelemetry | None = None
    gpus: dict[int, GpuFigures] = {}
    engines: dict[str, EngineFigures] = {}
    imex_up: bool | None = None
    imex_channels: int | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if labels.get("node") != node:
                continue
            if sample.name == "llmgw_node_info":
                telemetry = NodeTelemetry(node, labels.get("telemetry_source", "none"))
            elif sample.name.startswith("llmgw_gpu_") and labels.get("gpu", "").isdigit():
                index = int(labels["gpu"])
                parent = labels.get("parent", "")
                gpu = gpus.setdefault(
                    index,
                    GpuFigures(index, labels.get("name", ""), int(parent) if parent else None),
                )
                _gpu_sample(gpu, sample.name, labels, sample.value)
            elif sample.name == "llmgw_node_imex_up":
                imex_up = sample.value == 1
            elif sample.name == "llmgw_node_imex_channels":
                imex_channels = int(sample.value)
            elif sample.name.startswith("llmgw_node_engine_") and "replica" in labels:
                engine = engines.setdefault(
                    labels["replica"], EngineFigures(labels["replica"], labels.get("engine", ""))
                )
                if sample.name == "llmgw_node_engine_metrics_up":
                    engine.up = sample.value == 1
                elif sample.name in _ENGINE_VALUES:
                    setattr(engine, _ENGINE_VALUES[sample.name], sample.value)
    if telemetry is None:
        return None
    telemetry.gpus = [gpus[i] for i in sorted(gpus)]
    telemetry.engines = [engines[r] for r in sorted(engines)]
    telemetry.imex_up, telemetry.imex_channels = imex_up, imex_channels
    return telemetry


def _gpu_sample(gpu: GpuFigures, name: str, labels: dict[str, str], value: float) -> None:
    if name in _GPU_VALUES:
        setattr(gpu, _GPU_VALUES[name], value)
    elif name == "llmgw_gpu_ecc_errors" and labels.get("type") == "uncorrected":
        gpu.ecc_uncorrected = value
    elif name == "llmgw_gpu_nvlink_fabric_joined":
        gpu.fabric_joined = value == 1
    elif name == "llmgw_gpu_nvlink_fabric_degraded":
        gpu.fabric_degraded = value == 1
    elif name == "llmgw_gpu_remap_pending":
        gpu.remap_pending = value == 1
    elif name == "llmgw_gpu_throttle_active" and value == 1:
        reason = labels.get("reason", "")
        # An idle GPU lowers its clocks: normal, not a throttle an operator acts on.
        if reason and reason != "gpu_idle":
            gpu.throttled.append(reason)


def _mean(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _total(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def gpu_headline(gpus: list[GpuFigures]) -> str:
    """ "util 37%, mem 41/80 GiB, 61 C, 312/700 W" over these cards: mean utilisation, memory
    and power summed, the hottest temperature. Figures the GPUs did not give are left out."""
    if not gpus:
        return "-"
    parts = []
    util = _mean(g.utilization_pct for g in gpus)
    if util is not None:
        parts.append(f"util {util:.0f}%")
    used, total = _total(g.memory_used for g in gpus), _total(g.memory_total for g in gpus)
    if used is not None and total:
        parts.append(f"mem {used / _GIB:.0f}/{total / _GIB:.0f} GiB")
    temps = [g.temperature_c for g in gpus if g.temperature_c is not None]
    if temps:
        parts.append(f"{max(temps):.0f} C")
    power, limit = _total(g.power_w for g in gpus), _total(g.power_limit_w for g in gpus)
    if power is not None:
        parts.append(f"{power:.0f}/{limit:.0f} W" if limit else f"{power:.0f} W")
    return ", ".join(parts) or "-"


def node_warnings(telemetry: NodeTelemetry) -> list[str]:
    """What an operator should look at: throttling, uncorrected ECC, a remap awaiting reset."""
    found = []
    for gpu in telemetry.cards():
        if gpu.throttled:
            found.append(f"GPU {gpu.index} throttled: {', '.join(sorted(gpu.throttled))}")
        if gpu.ecc_uncorrected:
            found.append(f"GPU {gpu.index}: {gpu.ecc_uncorrected:.0f} uncorrected ECC errors")
        if gpu.remap_pending:
            found.append(f"GPU {gpu.index}: a row remap waits for a GPU reset")
    return found


class TelemetryUnavailable(Exception):
    """The agent's metrics could not be read, in words for the operator."""


async def read_agent(
    client: httpx.AsyncClient, url: str, node: str, timeout_s: float = READ_TIMEOUT_S
) -> NodeTelemetry:
    try:
        response = await client.get(url, timeout=timeout_s)
    except httpx.HTTPError as err:
        raise TelemetryUnavailable(f"{url}: {type(err).__name__}") from None
    if response.status_code != 200:
        raise TelemetryUnavailable(f"{url}: HTTP {response.status_code}")
    try:
        found = parse_agent_metrics(response.text, node)
    except ValueError as err:
        raise TelemetryUnavailable(f"{url}: not Prometheus text ({err})") from None
    if found is None:
        raise TelemetryUnavailable(f"{url} is not node {node}'s agent (its metrics on loopback?)")
    return found


async def read_agents(urls: dict[str, str]) -> dict[str, NodeTelemetry | str]:
    """Every node's telemetry, read at once: node -> figures, or why there are none."""

    async def one(client: httpx.AsyncClient, node: str, url: str) -> NodeTelemetry | str:
        if not url:
            return "its agent serves no metrics (llmgw agent --metrics-port)"
        try:
            return await read_agent(client, url, node)
        except TelemetryUnavailable as err:
            return str(err)

    # Proxies are for the internet; agents are on the operator's own network.
    async with httpx.AsyncClient(trust_env=False) as client:
        found = await asyncio.gather(*(one(client, n, u) for n, u in urls.items()))
    return dict(zip(urls, found, strict=True))
