"""What `llmgw top` shows, as plain data: one `TopData` per refresh, built from what the CLI
already reads (the ledger's snapshot, the node agents' /metrics, the gateway's admin API), and
the figures that need two refreshes (requests and tokens per second) worked out from a pair.

Pure: no I/O here (workers/top/source.py reads, workers/top/render.py draws), so every figure
is tested from hand-made data. `TopData` is a pydantic model so a stand-in source can keep one
in a JSON file.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import Any

from pydantic import BaseModel, Field

from gateway.console.figures import CACHE_REASONS
from store.models import PRIORITY_CLASSES
from workers.node_telemetry import GpuFigures, NodeTelemetry
from workflows.contracts import LedgerState


class GpuRow(BaseModel):
    index: int
    name: str = ""
    parent: int | None = None
    utilization_pct: float | None = None
    memory_used: float | None = None
    memory_total: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    warning: str = ""  # throttling, uncorrected ECC, a remap waiting for a reset


class NodeRow(BaseModel):
    name: str
    state: str
    cordoned: bool = False
    draining: bool = False
    note: str = ""  # why it was cordoned or drained, or what its workflow is doing about it
    cpu_cores: int = 0
    memory_mb: int = 0
    gpus: list[GpuRow] = Field(default_factory=list)
    # Why there are no GPU figures ("" when there are, or the node has no GPUs).
    telemetry_problem: str = ""


class ReplicaRow(BaseModel):
    replica_id: str
    model: str
    state: str
    node: str
    engine: str = ""
    running: float | None = None  # from the node agent's reading of the engine's metrics
    waiting: float | None = None
    detail: str = ""


class ModelCounters(BaseModel):
    """The gateway's counters for one model since it started (llmgw_*_total)."""

    model: str
    requests: float = 0.0
    errors: float = 0.0  # answers not 2xx
    tokens: float = 0.0
    routed: float = 0.0  # replica choices
    routed_to_cache: float = 0.0  # of which to a replica holding the prompt's prefix
    # Replica choices by routing state (exact, approximate, degraded, fallback:
    # docs/routing-states.md).
    states: dict[str, float] = Field(default_factory=dict)
    predicted: float = 0.0  # requests sent where a prefix was predicted, the engine's figure back
    incorrect: float = 0.0  # of which the engine held less than half the prediction
    # Requests the fair queue refused, by reason (queue_full: 429, queue_timeout: 503).
    queue_refused: dict[str, float] = Field(default_factory=dict)


class WaitingRow(BaseModel):
    """Requests of one key and priority class waiting in the gateway's fair queue for a model."""

    model: str
    key: str
    priority: str
    waiting: float
    oldest_s: float | None = None  # how long the longest-waiting of them has waited


class KeyQuota(BaseModel):
    name: str
    requests_today: int = 0
    tokens_today: int = 0
    # Tokens spent in the budget's period (the UTC day or calendar month), and the budget.
    budget_spent: int = 0
    token_budget: int | None = None
    budget_period: str = "day"
    rpm: int | None = None
    tpm: int | None = None


class ModelRow(BaseModel):
    """A model in the catalog: the replicas it wants and those ready."""

    name: str
    wanted: int = 0
    ready: int = 0
    engine: str = ""
    external: bool = False
    removing: bool = False


class ArtifactRow(BaseModel):
    """A name in the control plane's mirror: its artifact and the models that use it."""

    name: str
    digest: str
    size: int | None = None  # None: the manifest could not be read (`problem` says why)
    files: int = 0
    source: str = ""
    models: list[str] = Field(default_factory=list)
    problem: str = ""


class FetchRow(BaseModel):
    """A node's fetch of an artifact in progress (`llmgw fetches`' columns)."""

    node: str
    artifact: str
    model: str
    state: str
    progress: str = ""
    detail: str = ""


class TopData(BaseModel):
    taken_at: float  # seconds (monotonic for a live source): only differences matter
    nodes: list[NodeRow] = Field(default_factory=list)
    replicas: list[ReplicaRow] = Field(default_factory=list)
    models: list[ModelCounters] = Field(default_factory=list)
    keys: list[KeyQuota] = Field(default_factory=list)
    in_flight: float | None = None  # the gateway's requests being proxied now
    waiting: list[WaitingRow] = Field(default_factory=list)  # in the gateway's fair queue
    # Replica id -> the requests the gateway sends it at once, learnt from its engine.
    replica_depths: dict[str, float] = Field(default_factory=dict)
    catalog: list[ModelRow] = Field(default_factory=list)  # the models defined
    mirror: list[ArtifactRow] = Field(default_factory=list)
    mirror_dir: str = ""  # where the mirror was read ("" when it was not)
    fetches: list[FetchRow] = Field(default_factory=list)
    # What could not be read this time, in words ("gateway admin API: ConnectError").
    problems: list[str] = Field(default_factory=list)


def gpu_rows(telemetry: NodeTelemetry) -> list[GpuRow]:
    return [_gpu_row(g) for g in telemetry.gpus]


def _gpu_row(gpu: GpuFigures) -> GpuRow:
    warnings = []
    if gpu.throttled:
        warnings.append("throttled: " + ",".join(sorted(gpu.throttled)))
    if gpu.ecc_uncorrected:
        warnings.append(f"{gpu.ecc_uncorrected:.0f} uncorrected ECC")
    if gpu.remap_pending:
        warnings.append("remap pending")
    return GpuRow(
        index=gpu.index,
        name=gpu.name,
        parent=gpu.parent,
        utilization_pct=gpu.utilization_pct,
        memory_used=gpu.memory_used,
        memory_total=gpu.memory_total,
        temperature_c=gpu.temperature_c,
        power_w=gpu.power_w,
        power_limit_w=gpu.power_limit_w,
        warning="; ".join(warnings),
    )


def cluster_rows(
    ledger: LedgerState, telemetry: dict[str, NodeTelemetry | str]
) -> tuple[list[NodeRow], list[ReplicaRow]]:
    """Nodes with their GPUs now, and replicas with their engines' load, from the ledger and
    the agents' readings (node -> figures, or why there are none)."""
    nodes = []
    engine_load = {}
    for name, record in sorted(ledger.nodes.items()):
        figures = telemetry.get(name)
        problem = ""
        gpus: list[GpuRow] = []
        if isinstance(figures, NodeTelemetry):
            gpus = gpu_rows(figures)
            engine_load.update({e.replica: e for e in figures.engines if e.up})
        elif record.inventory.gpus:
            problem = figures or "no reading"
        nodes.append(
            NodeRow(
                name=name,
                state=record.state.value,
                cordoned=record.cordoned,
                draining=record.draining,
                note=record.note,
                cpu_cores=record.inventory.cpu_cores,
                memory_mb=record.inventory.memory_mb,
                gpus=gpus,
                telemetry_problem=problem,
            )
        )
    replicas = []
    for route in sorted(ledger.routes.values(), key=lambda r: r.replica_id):
        load = engine_load.get(route.replica_id)
        replicas.append(
            ReplicaRow(
                replica_id=route.replica_id,
                model=route.model,
                state=route.state.value + (" (node unreachable)" if route.node_unreachable else ""),
                node=route.node,
                engine=route.engine,
                running=load.running if load else None,
                waiting=load.waiting if load else None,
                detail=route.detail,
            )
        )
    return nodes, replicas


@dataclass(frozen=True)
class ModelRates:
    model: str
    requests_per_s: float | None  # None on the first refresh: a rate needs two
    tokens_per_s: float | None
    error_share: float | None  # of the requests answered since the last refresh
    cache_share: float | None  # of the replica choices since the last refresh
    # The state most replica choices since the last refresh were in, and its share of them.
    state: str | None = None
    state_share: float | None = None
    # Of the requests predicted to find a prefix since the last refresh, those that did not.
    incorrect_share: float | None = None


def _since(now: float, then: float) -> float:
    # A counter that went down: the gateway restarted and counts from zero again.
    return now - then if now >= then else now


def model_rates(current: TopData, previous: TopData | None) -> list[ModelRates]:
    """Per model, what happened between the previous refresh and this one; no rates on the
    first refresh, which has nothing to compare with."""
    seconds = current.taken_at - previous.taken_at if previous is not None else 0.0
    before = {m.model: m for m in previous.models} if previous is not None else {}
    rates = []
    for now in sorted(current.models, key=lambda m: m.model):
        if seconds <= 0:
            rates.append(ModelRates(now.model, None, None, None, None))
            continue
        then = before.get(now.model, ModelCounters(model=now.model))
        requests = _since(now.requests, then.requests)
        routed = _since(now.routed, then.routed)
        states = {s: _since(n, then.states.get(s, 0.0)) for s, n in now.states.items()}
        decided = sum(states.values())
        state = max(sorted(states), key=lambda s: states[s]) if decided else None
        predicted = _since(now.predicted, then.predicted)
        rates.append(
            ModelRates(
                model=now.model,
                requests_per_s=requests / seconds,
                tokens_per_s=_since(now.tokens, then.tokens) / seconds,
                error_share=_since(now.errors, then.errors) / requests if requests else None,
                cache_share=(
                    _since(now.routed_to_cache, then.routed_to_cache) / routed if routed else None
                ),
                state=state,
                state_share=states[state] / decided if state is not None else None,
                incorrect_share=(
                    _since(now.incorrect, then.incorrect) / predicted if predicted else None
                ),
            )
        )
    return rates


def counters_from_samples(
    samples: list[tuple[str, dict[str, str], float]],
) -> tuple[list[ModelCounters], float | None]:
    """The gateway's /metrics samples (name, labels, value) as counters per model, and the
    requests in flight."""
    models: dict[str, ModelCounters] = {}
    in_flight = None
    for name, labels, value in samples:
        if name == "llmgw_requests_in_flight":
            in_flight = value
            continue
        model = labels.get("model")
        if model is None:
            continue
        counters = models.setdefault(model, ModelCounters(model=model))
        if name == "llmgw_requests_total":
            counters.requests += value
            if not labels.get("status", "").startswith("2"):
                counters.errors += value
        elif name == "llmgw_tokens_total":
            counters.tokens += value
        elif name == "llmgw_routing_decisions_total":
            counters.routed += value
            if labels.get("reason") in CACHE_REASONS:
                counters.routed_to_cache += value
        elif name == "llmgw_routing_state_total":
            state = labels.get("state", "")
            counters.states[state] = counters.states.get(state, 0.0) + value
        elif name == "llmgw_routing_predicted_total":
            counters.predicted += value
        elif name == "llmgw_routing_incorrect_total":
            counters.incorrect += value
        elif name == "llmgw_queue_refusals_total":
            reason = labels.get("reason", "")
            counters.queue_refused[reason] = counters.queue_refused.get(reason, 0.0) + value
    return list(models.values()), in_flight


def _class_order(priority: str) -> int:
    """A class's place, highest first; a name this CLI does not know goes last."""
    names: tuple[str, ...] = PRIORITY_CLASSES
    return names.index(priority) if priority in names else len(names)


def queue_from_samples(
    samples: list[tuple[str, dict[str, str], float]],
) -> tuple[list[WaitingRow], dict[str, float]]:
    """The gateway's /metrics samples as who waits in its fair queue (by model, the highest
    class first, then key) and each replica's learnt depth."""
    rows: dict[tuple[str, str, str], WaitingRow] = {}
    oldest: dict[tuple[str, str, str], float] = {}
    depths: dict[str, float] = {}
    for name, labels, value in samples:
        if name == "llmgw_replica_depth":
            depths[labels.get("replica", "")] = value
            continue
        place = (labels.get("model", ""), labels.get("key", ""), labels.get("priority", ""))
        if name == "llmgw_queue_waiting" and value > 0:
            rows[place] = WaitingRow(model=place[0], key=place[1], priority=place[2], waiting=value)
        elif name == "llmgw_queue_oldest_wait_seconds":
            oldest[place] = value
    for place, row in rows.items():
        row.oldest_s = oldest.get(place)
    ordered = sorted(rows.values(), key=lambda r: (r.model, _class_order(r.priority), r.key))
    return ordered, depths


def key_quotas(
    keys: list[dict[str, Any]], usage: list[dict[str, Any]], today: date
) -> list[KeyQuota]:
    """Each active key's use today and of its token budget, from the admin API's answers to
    GET /admin/v1/keys and GET /admin/v1/usage (rows since at least the month's first day)."""
    by_key: dict[str, list[dict[str, Any]]] = {}
    for row in usage:
        by_key.setdefault(str(row.get("key_id")), []).append(row)
    quotas = []
    for key in keys:
        if key.get("revoked_at"):
            continue
        limits = key.get("limits") or {}
        period = str(limits.get("budget_period") or "day")
        start = today.replace(day=1) if period == "month" else today
        rows = by_key.get(str(key.get("key_id")), [])

        def tokens(row: dict[str, Any]) -> int:
            return int(row.get("prompt_tokens", 0)) + int(row.get("completion_tokens", 0))

        on = [(date.fromisoformat(str(r["day"])), r) for r in rows if "day" in r]
        quotas.append(
            KeyQuota(
                name=str(key.get("name", key.get("key_id", "?"))),
                requests_today=sum(int(r.get("requests", 0)) for d, r in on if d == today),
                tokens_today=sum(tokens(r) for d, r in on if d == today),
                budget_spent=sum(tokens(r) for d, r in on if start <= d <= today),
                token_budget=limits.get("token_budget"),
                budget_period=period,
                rpm=limits.get("rpm"),
                tpm=limits.get("tpm"),
            )
        )
    return quotas
