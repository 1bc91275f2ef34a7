"""What the web console shows of the cluster, as plain data: one `ClusterView` per refresh, built
from what the CLI already reads (the ledger's snapshot, the node agents' /metrics, the model
workflows' views, the running fetches and the installs' heartbeats).

Pure: no I/O here (workers/console_cluster.py reads), so every figure is tested from hand-made
data. The pieces `llmgw nodes`, `llmgw top`, `llmgw model why` and `llmgw fetches` already
work out (why a node is not placeable, GPU rows, fetch progress, placement's explanation) are
called, not written again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from workers.commands.mirror import MirrorEntry
from workers.commands.model import describe_profile
from workers.commands.node import gpu_summary, why_not_placeable
from workers.console_mirror import ImportView, MirrorView, mirror_view
from workers.console_node import (
    FabricView,
    HardwareView,
    ResourceView,
    fabric_view,
    hardware_view,
    resource_views,
)
from workers.fetch_progress import FetchStatus, fetch_row
from workers.node_telemetry import NodeTelemetry
from workers.top.data import GpuRow, cluster_rows
from workflows.contracts import (
    EngineState,
    GpuInfo,
    LedgerState,
    ModelView,
    NodeRecord,
    ReplicaState,
)
from workflows.names import (
    engine_install_workflow_id,
    model_workflow_id,
    node_workflow_id,
)
from workflows.placement import explain

MIB = 1024 * 1024


class GpuView(BaseModel):
    index: int
    name: str
    gpu_class: str
    memory_mb: int
    mig_profile: str = ""  # "3g.40gb" for a MIG instance
    parent: int | None = None  # the card, for a MIG instance
    nvlink_domain: str = ""
    unusable: str = ""
    # Now, from the node agent's telemetry; None when not read.
    utilization_pct: float | None = None
    memory_used_mb: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    warning: str = ""
    replica: str = ""  # the replica holding it, if any
    # Its multi-node NVLink fabric (FabricView's rule); None: outside any fabric.
    fabric_joined: bool | None = None
    fabric_degraded: bool | None = None


class EngineView(BaseModel):
    engine: str
    version: str
    state: str
    detail: str = ""
    progress: str = ""  # the install's latest heartbeat, while installing
    workflow_id: str


class NodeView(BaseModel):
    name: str
    state: str
    address: str
    cordoned: bool
    draining: bool
    note: str
    cpu_model: str
    cpu_cores: int
    memory_mb: int
    gpu_summary: str
    gpus: list[GpuView]
    telemetry_problem: str
    engines: list[EngineView]
    why_not_placeable: list[str]
    replicas: list[str]
    workflow_id: str
    hardware: HardwareView
    fabric: FabricView | None = None  # None: no GPU in a fabric and no IMEX


class ReplicaView(BaseModel):
    replica_id: str
    model: str
    state: str
    node: str
    nodes: list[str]  # every shard's node, leader first
    engine: str
    detail: str
    running: float | None
    waiting: float | None
    fabric: str = ""
    nvlink_domain: str = ""
    workflow_id: str = ""


class ModelConsoleView(BaseModel):
    name: str
    profiles: list[str]
    wanted: int
    ready: int
    replicas: list[str]
    removing: bool
    # Rolling update: replicas on a profile the catalog no longer has, and those kept serving
    # until their successor is ready.
    stale: list[str]
    retiring: list[str]
    why: list[str]  # `llmgw model why`
    workflow_id: str


class TrayView(BaseModel):
    node: str
    gpus: list[GpuView]
    fabric: FabricView | None = None


class DomainView(BaseModel):
    domain: str
    trays: list[TrayView]
    replicas: list[str]  # replicas with a GPU in this domain


class FetchView(BaseModel):
    workflow_id: str
    node: str
    artifact: str
    model: str
    state: str
    done: int = 0
    total: int = 0
    progress: str = ""
    detail: str = ""


class ClusterView(BaseModel):
    temporal_ui: str = ""  # the Temporal web UI's base URL; "" when none runs
    namespace: str = "default"
    nodes: list[NodeView] = Field(default_factory=list)
    replicas: list[ReplicaView] = Field(default_factory=list)
    models: list[ModelConsoleView] = Field(default_factory=list)
    domains: list[DomainView] = Field(default_factory=list)
    fetches: list[FetchView] = Field(default_factory=list)
    mirror: MirrorView = Field(default_factory=MirrorView)
    imports: list[ImportView] = Field(default_factory=list)
    # Every placed replica's shards: reserved against used (`llmgw model resources`).
    resources: list[ResourceView] = Field(default_factory=list)
    # What could not be read this time, in words; the rest is still shown.
    problems: list[str] = Field(default_factory=list)


@dataclass
class ClusterReadings:
    """Everything one refresh read, handed to `cluster_view` as it came."""

    ledger: LedgerState
    telemetry: dict[str, NodeTelemetry | str] = field(default_factory=dict)
    models: list[ModelView] = field(default_factory=list)
    fetches: list[FetchStatus] = field(default_factory=list)
    # (node, engine, version) -> the install's latest heartbeat line
    install_progress: dict[tuple[str, str, str], str] = field(default_factory=dict)
    # `llmgw mirror ls`' names; None where the mirror is not on this machine.
    mirror: list[MirrorEntry] | None = None
    imports: list[ImportView] = field(default_factory=list)
    temporal_ui: str = ""
    problems: list[str] = field(default_factory=list)


def _gpu_holders(ledger: LedgerState) -> dict[tuple[str, int], str]:
    """(node, GPU index) -> the replica it is allocated to."""
    held = {}
    for allocation in ledger.allocations.values():
        for shard in allocation.shards_or_leader():
            for index in shard.gpus:
                held[(shard.node, index)] = allocation.replica_id
    return held


def _gpu_view(gpu: GpuInfo, node: str, held: dict[tuple[str, int], str]) -> GpuView:
    domain = gpu.fabric.domain if gpu.fabric is not None else None
    return GpuView(
        index=gpu.index,
        name=gpu.name,
        gpu_class=gpu.gpu_class,
        memory_mb=gpu.memory_mb,
        mig_profile=gpu.mig.profile if gpu.mig is not None else "",
        parent=gpu.mig.parent_index if gpu.mig is not None else None,
        nvlink_domain=domain or "",
        unusable=gpu.unusable,
        replica=held.get((node, gpu.index), ""),
    )


def _with_fabric(view: GpuView, fabric: FabricView | None) -> GpuView:
    mine = next((g for g in fabric.gpus if g.index == view.index), None) if fabric else None
    if mine is None:
        return view
    return view.model_copy(update={"fabric_joined": mine.joined, "fabric_degraded": mine.degraded})


def _with_figures(view: GpuView, figures: dict[int, GpuRow]) -> GpuView:
    row = figures.get(view.index)
    if row is None:
        return view
    used = row.memory_used / MIB if row.memory_used is not None else None
    return view.model_copy(
        update={
            "utilization_pct": row.utilization_pct,
            "memory_used_mb": used,
            "temperature_c": row.temperature_c,
            "power_w": row.power_w,
            "power_limit_w": row.power_limit_w,
            "warning": row.warning,
        }
    )


def _engines(record: NodeRecord, progress: dict[tuple[str, str, str], str]) -> list[EngineView]:
    name = record.inventory.name
    views = []
    for status in sorted(record.engines.values(), key=lambda s: s.engine):
        key = (name, status.engine, status.version)
        views.append(
            EngineView(
                engine=status.engine,
                version=status.version,
                state=status.state.value,
                detail=status.detail,
                progress=progress.get(key, "") if status.state == EngineState.INSTALLING else "",
                workflow_id=engine_install_workflow_id(*key),
            )
        )
    return views


def node_views(readings: ClusterReadings) -> list[NodeView]:
    ledger = readings.ledger
    held = _gpu_holders(ledger)
    rows, _ = cluster_rows(ledger, readings.telemetry)
    rows_by_name = {row.name: row for row in rows}
    on_node: dict[str, list[str]] = {}
    for allocation in ledger.allocations.values():
        for shard in allocation.shards_or_leader():
            on_node.setdefault(shard.node, []).append(allocation.replica_id)
    views = []
    for name, record in sorted(ledger.nodes.items()):
        inv = record.inventory
        row = rows_by_name[name]
        figures = {gpu.index: gpu for gpu in row.gpus}
        fabric = fabric_view(record, readings.telemetry.get(name))
        gpus = [_with_figures(_gpu_view(g, name, held), figures) for g in inv.gpus]
        views.append(
            NodeView(
                name=name,
                state=record.state.value,
                address=inv.address,
                cordoned=record.cordoned,
                draining=record.draining,
                note=record.note,
                cpu_model=inv.cpu_model,
                cpu_cores=inv.cpu_cores,
                memory_mb=inv.memory_mb,
                gpu_summary=gpu_summary(record),
                gpus=[_with_fabric(g, fabric) for g in gpus],
                telemetry_problem=row.telemetry_problem,
                engines=_engines(record, readings.install_progress),
                why_not_placeable=why_not_placeable(record),
                replicas=sorted(set(on_node.get(name, []))),
                workflow_id=node_workflow_id(name),
                hardware=hardware_view(record),
                fabric=fabric,
            )
        )
    return views


def replica_views(readings: ClusterReadings) -> list[ReplicaView]:
    ledger = readings.ledger
    _, rows = cluster_rows(ledger, readings.telemetry)
    views = []
    for row in rows:
        allocation = ledger.allocations.get(row.replica_id)
        nodes = [s.node for s in allocation.shards_or_leader()] if allocation else [row.node]
        views.append(
            ReplicaView(
                replica_id=row.replica_id,
                model=row.model,
                state=row.state,
                node=row.node,
                nodes=list(dict.fromkeys(nodes)),
                engine=row.engine,
                detail=row.detail,
                running=row.running,
                waiting=row.waiting,
                fabric=allocation.fabric if allocation else "",
                nvlink_domain=allocation.nvlink_domain if allocation else "",
                workflow_id=allocation.workflow_id if allocation else "",
            )
        )
    return views


def model_views(readings: ClusterReadings) -> list[ModelConsoleView]:
    ledger = readings.ledger
    views = []
    for model in sorted(readings.models, key=lambda v: v.spec.name):
        spec = model.spec
        routes = [r for r in ledger.routes.values() if r.model == spec.name]
        why = [] if spec.external else explain(ledger, spec)
        pending = [r for r in routes if r.state == ReplicaState.PENDING]
        pending.sort(key=lambda r: r.replica_id)
        why += [f"{r.replica_id} is pending: {r.detail}" for r in pending]
        views.append(
            ModelConsoleView(
                name=spec.name,
                profiles=[describe_profile(p) for p in spec.profiles],
                wanted=spec.replicas,
                ready=sum(1 for r in routes if r.state == ReplicaState.READY),
                replicas=sorted(model.replica_ids),
                removing=model.removing,
                stale=sorted(model.stale),
                retiring=sorted(model.retiring),
                why=why,
                workflow_id=model_workflow_id(spec.name),
            )
        )
    return views


def domain_views(nodes: list[NodeView]) -> list[DomainView]:
    """NVLink domains (a GB200 NVL72 rack is one: 18 trays of 4 GPUs), each with its trays and
    the replicas holding GPUs in it, so a replica spanning trays shows on each of them."""
    trays: dict[str, list[TrayView]] = {}
    for node in nodes:
        by_domain: dict[str, list[GpuView]] = {}
        for gpu in node.gpus:
            if gpu.nvlink_domain:
                by_domain.setdefault(gpu.nvlink_domain, []).append(gpu)
        for domain, gpus in by_domain.items():
            tray = TrayView(node=node.name, gpus=gpus, fabric=node.fabric)
            trays.setdefault(domain, []).append(tray)
    views = []
    for domain, in_domain in sorted(trays.items()):
        replicas = sorted({g.replica for t in in_domain for g in t.gpus if g.replica})
        views.append(DomainView(domain=domain, trays=in_domain, replicas=replicas))
    return views


def fetch_views(fetches: list[FetchStatus]) -> list[FetchView]:
    views = []
    for status in fetches:
        node, artifact, model, state, progress, detail = fetch_row(status)
        report = status.report
        views.append(
            FetchView(
                workflow_id=status.workflow_id,
                node=node,
                artifact=artifact,
                model=model,
                state=state,
                done=report.done if report else 0,
                total=report.total if report else 0,
                progress=progress,
                detail=detail,
            )
        )
    return views


def cluster_view(readings: ClusterReadings) -> ClusterView:
    nodes = node_views(readings)
    return ClusterView(
        temporal_ui=readings.temporal_ui,
        nodes=nodes,
        replicas=replica_views(readings),
        models=model_views(readings),
        domains=domain_views(nodes),
        fetches=fetch_views(readings.fetches),
        mirror=mirror_view(
            readings.mirror, readings.models, readings.ledger.nodes, readings.fetches
        ),
        imports=list(readings.imports),
        resources=resource_views(readings.ledger, readings.telemetry),
        problems=list(readings.problems),
    )
