"""The node agent's Prometheus metrics: its GPUs' telemetry (gpu_telemetry.py), its engines'
load and memory, and its NVLink fabric and IMEX state, as `llmgw_gpu_*` and `llmgw_node_*`
families on `GET /metrics`.

A background loop reads both every few seconds and keeps the latest reading; a scrape renders
that reading and never waits on NVML, nvidia-smi or an engine, so any number of scrapers cost
the machine one reading per period. Every family carries the node's name as `node`, which is
also how `llmgw nodes` and `llmgw top` tell this agent's figures from another's.

The listener is unauthenticated (the figures name GPUs and replicas, nothing secret) and binds
loopback unless the operator names another address (`llmgw agent --metrics-host`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from activities.agent.engine_memory import EngineMemory
from activities.agent.gpu_telemetry import (
    GpuSample,
    NvmlTelemetry,
    TelemetryReading,
    read_telemetry,
)
from activities.http_site import start_site
from workflows.contracts import EngineLoad, NodeInventory

log = logging.getLogger("llmgw.agent.metrics")
METRICS_PATH = "/metrics"
# How often GPUs and engines are read: a Prometheus scrape interval is 15 s by default, and
# `llmgw top` refreshes every 2 s; NVML answers in milliseconds, nvidia-smi in about a second.
READ_EVERY_S = 2.0
_MIB = 1024 * 1024


@dataclass(frozen=True)
class EngineLoadSample:
    replica_id: str
    engine: str
    load: EngineLoad
    memory: EngineMemory | None = None  # None: not measured (the process is gone)


@dataclass
class NodeReading:
    """The latest of everything the loop reads; what a scrape renders."""

    gpus: TelemetryReading = field(default_factory=lambda: TelemetryReading([], "none"))
    engines: list[EngineLoadSample] = field(default_factory=list)
    read_at: float | None = None  # time.monotonic() of the last reading; None: none yet
    # The agent's latest look at the machine (every minute): NVLink fabric and IMEX state.
    inventory: NodeInventory | None = None


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def _gpu_labels(node: str, gpu: GpuSample) -> list[str]:
    return [
        node,
        str(gpu.index),
        gpu.uuid,
        gpu.name,
        "" if gpu.parent is None else str(gpu.parent),
    ]


def node_families(node: str, reading: NodeReading, now: float) -> list[Metric]:
    """Prometheus families for this reading: only figures the tool gave (N/A is left out,
    not exported as 0, so a dashboard shows a gap rather than a false zero)."""
    gpu_labels = ["node", "gpu", "uuid", "name", "parent"]
    info = _gauge(
        "llmgw_node_info",
        "1 for a node agent; telemetry_source is nvml, nvidia-smi or none.",
        ["node", "telemetry_source"],
    )
    info.add_metric([node, reading.gpus.source], 1)
    age = _gauge(
        "llmgw_node_telemetry_age_seconds",
        "Seconds since the GPUs and engines were read.",
        ["node"],
    )
    if reading.read_at is not None:
        age.add_metric([node], max(0.0, now - reading.read_at))
    failing = _gauge(
        "llmgw_node_telemetry_failing",
        "1 while NVIDIA tooling is present but the last GPU reading failed.",
        ["node"],
    )
    failing.add_metric([node], 1 if reading.gpus.problem else 0)

    gauges: dict[str, tuple[GaugeMetricFamily, Callable[[GpuSample], float | None]]] = {
        "util": (
            _gauge("llmgw_gpu_utilization_percent", "GPU busy time, percent.", gpu_labels),
            lambda g: g.utilization_pct,
        ),
        "used": (
            _gauge("llmgw_gpu_memory_used_bytes", "Framebuffer memory in use.", gpu_labels),
            lambda g: None if g.memory_used_mb is None else g.memory_used_mb * _MIB,
        ),
        "total": (
            _gauge("llmgw_gpu_memory_total_bytes", "Framebuffer memory in all.", gpu_labels),
            lambda g: None if g.memory_total_mb is None else g.memory_total_mb * _MIB,
        ),
        "temp": (
            _gauge("llmgw_gpu_temperature_celsius", "GPU core temperature.", gpu_labels),
            lambda g: g.temperature_c,
        ),
        "power": (
            _gauge("llmgw_gpu_power_watts", "Board power draw.", gpu_labels),
            lambda g: g.power_w,
        ),
        "limit": (
            _gauge("llmgw_gpu_power_limit_watts", "Enforced board power limit.", gpu_labels),
            lambda g: g.power_limit_w,
        ),
        "pending": (
            _gauge(
                "llmgw_gpu_remap_pending",
                "1 when a row remap waits for a GPU reset to take effect.",
                gpu_labels,
            ),
            lambda g: None if g.remap_pending is None else float(g.remap_pending),
        ),
        "failed": (
            _gauge("llmgw_gpu_remap_failed", "1 when a row remap has failed.", gpu_labels),
            lambda g: None if g.remap_failed is None else float(g.remap_failed),
        ),
    }
    ecc = _gauge(
        "llmgw_gpu_ecc_errors",
        "Volatile ECC errors (since the driver loaded), by type: corrected, uncorrected.",
        [*gpu_labels, "type"],
    )
    retired = _gauge(
        "llmgw_gpu_retired_pages",
        "Memory pages retired, by cause: single_bit (repeated), double_bit.",
        [*gpu_labels, "cause"],
    )
    remapped = _gauge(
        "llmgw_gpu_remapped_rows",
        "Memory rows remapped, by type: correctable, uncorrectable.",
        [*gpu_labels, "type"],
    )
    throttle = _gauge(
        "llmgw_gpu_throttle_active",
        "1 for each reason that holds the GPU's clocks down now (sw_power_cap, "
        "hw_thermal_slowdown, ...), 0 for each one reported inactive.",
        [*gpu_labels, "reason"],
    )
    for gpu in reading.gpus.samples:
        labels = _gpu_labels(node, gpu)
        for family, value_of in gauges.values():
            value = value_of(gpu)
            if value is not None:
                family.add_metric(labels, value)
        for family, pairs in (
            (ecc, (("corrected", gpu.ecc_corrected), ("uncorrected", gpu.ecc_uncorrected))),
            (
                retired,
                (
                    ("single_bit", gpu.retired_pages_single_bit),
                    ("double_bit", gpu.retired_pages_double_bit),
                ),
            ),
            (
                remapped,
                (
                    ("correctable", gpu.remapped_rows_correctable),
                    ("uncorrectable", gpu.remapped_rows_uncorrectable),
                ),
            ),
        ):
            for kind, count in pairs:
                if count is not None:
                    family.add_metric([*labels, kind], count)
        for reason, active in sorted(gpu.throttle.items()):
            throttle.add_metric([*labels, reason], 1 if active else 0)

    engine_labels = ["node", "replica", "engine"]
    up = _gauge(
        "llmgw_node_engine_metrics_up",
        "1 when the agent read this engine's own metrics at its last reading.",
        engine_labels,
    )
    running = _gauge(
        "llmgw_node_engine_requests_running", "Requests the engine is running.", engine_labels
    )
    waiting = _gauge(
        "llmgw_node_engine_requests_waiting", "Requests queued in the engine.", engine_labels
    )
    tokens = CounterMetricFamily(
        "llmgw_node_engine_tokens",
        "The engine's token counters summed (reset when it restarts).",
        labels=engine_labels,
    )
    rss = _gauge(
        "llmgw_node_engine_memory_rss_bytes",
        "Resident memory of the engine's processes (its process group).",
        engine_labels,
    )
    gpu_held = _gauge(
        "llmgw_node_engine_gpu_memory_bytes",
        "GPU memory the engine's processes hold on its GPUs (nvidia-smi's compute apps).",
        engine_labels,
    )
    for sample in reading.engines:
        labels = [node, sample.replica_id, sample.engine]
        if sample.memory is not None:
            rss.add_metric(labels, sample.memory.rss_bytes)
            if sample.memory.gpu_memory_mb is not None:
                gpu_held.add_metric(labels, sample.memory.gpu_memory_mb * _MIB)
        up.add_metric(labels, 1 if sample.load.seen else 0)
        if sample.load.seen:
            running.add_metric(labels, sample.load.running)
            waiting.add_metric(labels, sample.load.waiting)
            tokens.add_metric(labels, sample.load.work)
    return [
        info,
        age,
        failing,
        *(family for family, _ in gauges.values()),
        ecc,
        retired,
        remapped,
        throttle,
        up,
        running,
        waiting,
        tokens,
        rss,
        gpu_held,
        *fabric_families(node, reading.inventory),
    ]


# A fabric state that says the GPU takes no part in a multi-node NVLink fabric.
_NO_FABRIC = ("", "Not Supported")


def fabric_families(node: str, inventory: NodeInventory | None) -> list[Metric]:
    """Each GPU's multi-node NVLink fabric (joined, degraded) and the node's IMEX, from the
    agent's latest look. Left out where the machine has none: a GPU outside any fabric, a node
    with neither IMEX nor such a GPU."""
    labels = ["node", "gpu", "uuid", "domain"]
    joined = _gauge(
        "llmgw_gpu_nvlink_fabric_joined",
        "1 when the GPU joined its NVLink domain (state Completed, status Success).",
        labels,
    )
    degraded = _gauge(
        "llmgw_gpu_nvlink_fabric_degraded",
        "1 when the GPU's fabric bandwidth is not Full.",
        labels,
    )
    imex_up = _gauge("llmgw_node_imex_up", "1 while nvidia-imex runs on the node.", ["node"])
    channels = _gauge(
        "llmgw_node_imex_channels",
        "IMEX channels the node has (/dev/nvidia-caps-imex-channels).",
        ["node"],
    )
    if inventory is None:
        return []
    fabric_gpus = [g for g in inventory.gpus if g.fabric and g.fabric.state not in _NO_FABRIC]
    for gpu in fabric_gpus:
        assert gpu.fabric is not None
        values = [node, str(gpu.index), gpu.uuid, gpu.fabric.domain or ""]
        joined.add_metric(values, 1 if gpu.fabric.joined else 0)
        if gpu.fabric.bandwidth:
            degraded.add_metric(values, 0 if gpu.fabric.bandwidth == "Full" else 1)
    imex = inventory.imex
    if (imex is not None and imex.installed) or fabric_gpus:
        imex_up.add_metric([node], 1 if imex is not None and imex.running else 0)
        channels.add_metric([node], len(imex.channels) if imex is not None else 0)
    return [joined, degraded, imex_up, channels]


class _ReadingCollector(Collector):
    def __init__(self, node: str, latest: Callable[[], NodeReading]) -> None:
        self._node = node
        self._latest = latest

    def collect(self) -> Iterable[Metric]:
        return node_families(self._node, self._latest(), time.monotonic())


def render(node: str, reading: NodeReading) -> bytes:
    """The Prometheus text exposition of this reading."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ReadingCollector(node, lambda: reading))
    return generate_latest(registry)


ReadEngines = Callable[[], Awaitable[list[EngineLoadSample]]]


class NodeMetricsService:
    """The reading loop and the HTTP listener. `read_gpus` and `read_engines` are seams: the
    agent passes NVML/nvidia-smi and its engines' own metrics, tests pass stand-ins."""

    def __init__(
        self,
        node: str,
        read_engines: ReadEngines,
        read_gpus: Callable[[], TelemetryReading] | None = None,
        every_s: float = READ_EVERY_S,
        read_inventory: Callable[[], NodeInventory | None] = lambda: None,
    ) -> None:
        self.node = node
        self.reading = NodeReading()
        self._read_engines = read_engines
        self._nvml = NvmlTelemetry()
        self._read_gpus = read_gpus or (lambda: read_telemetry(self._nvml.read))
        self._every_s = every_s
        self._read_inventory = read_inventory
        self._loop_task: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def read_once(self) -> None:
        gpus = await asyncio.to_thread(self._read_gpus)
        if gpus.problem and gpus.problem != self.reading.gpus.problem:
            log.warning("GPU telemetry: %s", gpus.problem)
        engines = await self._read_engines()
        self.reading = NodeReading(
            gpus=gpus, engines=engines, read_at=time.monotonic(), inventory=self._read_inventory()
        )

    async def _loop(self) -> None:
        while True:
            try:
                await self.read_once()
            except Exception as err:  # noqa: BLE001 - a failed reading must not end the loop
                log.warning("telemetry reading failed: %s", err)
            await asyncio.sleep(self._every_s)

    async def _metrics(self, _request: web.Request) -> web.Response:
        body = render(self.node, self.reading)
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})

    async def start(self, host: str, port: int) -> int:
        """Start reading and serve `GET /metrics` on host:port (0: any free port); the port."""
        app = web.Application()
        app.router.add_get(METRICS_PATH, self._metrics)
        self._runner, self.port = await start_site(app, host, port)
        self._loop_task = asyncio.create_task(self._loop())
        return self.port

    async def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
        self._nvml.close()
