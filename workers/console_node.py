"""The web console's per-node figures beyond `llmgw nodes`' own, as plain data: a node's
multi-node NVLink fabric and IMEX (per GPU joined or not, degraded or not), and what each replica
reserved beside what its engine uses (`llmgw model resources`' rows).

Pure, like workers/console_data.py: tested from hand-made data. The fabric is read as the agent
exports it (activities/agent/node_metrics.fabric_families, parsed by workers/node_telemetry.py);
where the agent's metrics cannot be read, or come from an agent older than those families, the
same exporter is run over the node's inventory as the ledger holds it, so both paths apply the
agent's one rule of what joined and degraded mean.
"""

from __future__ import annotations

from pydantic import BaseModel

from activities.agent.node_metrics import NodeReading, render
from workers.commands.model_resources import resource_rows
from workers.node_telemetry import NodeTelemetry, parse_agent_metrics
from workflows.contracts import LedgerState, NodeRecord

MIB = 1024 * 1024
FROM_AGENT = "agent"  # the agent's metrics now
FROM_INVENTORY = "inventory"  # the node's record, as the agent last published it


class FabricGpu(BaseModel):
    index: int
    joined: bool
    degraded: bool | None = None  # None: no bandwidth reported


class FabricView(BaseModel):
    """A node's (a tray's) part of its NVLink domain, and its IMEX daemon."""

    source: str  # FROM_AGENT or FROM_INVENTORY
    gpus: list[FabricGpu]
    # "joined", "degraded" (joined at less than full bandwidth), "not joined" (a GPU has not
    # joined its domain) or "" (no GPU in a fabric: IMEX only).
    state: str
    not_joined: list[int]  # GPU indexes
    degraded: list[int]
    imex_up: bool | None = None  # None: no IMEX reported
    imex_channels: int | None = None


def fabric_state(gpus: list[FabricGpu]) -> str:
    if not gpus:
        return ""
    if not all(g.joined for g in gpus):
        return "not joined"
    return "degraded" if any(g.degraded for g in gpus) else "joined"


def _from_telemetry(telemetry: NodeTelemetry, source: str) -> FabricView | None:
    gpus = [
        FabricGpu(index=g.index, joined=g.fabric_joined, degraded=g.fabric_degraded)
        for g in telemetry.gpus
        if g.fabric_joined is not None
    ]
    if not gpus and telemetry.imex_up is None:
        return None
    return FabricView(
        source=source,
        gpus=gpus,
        state=fabric_state(gpus),
        not_joined=[g.index for g in gpus if not g.joined],
        degraded=[g.index for g in gpus if g.degraded],
        imex_up=telemetry.imex_up,
        imex_channels=telemetry.imex_channels,
    )


def fabric_view(record: NodeRecord, told: NodeTelemetry | str | None) -> FabricView | None:
    """The node's fabric from its agent's metrics, else from its inventory through the agent's
    own exporter; None for a node with neither a GPU in a fabric nor IMEX."""
    if isinstance(told, NodeTelemetry):
        exported = any(g.fabric_joined is not None for g in told.gpus) or told.imex_up is not None
        if exported:
            return _from_telemetry(told, FROM_AGENT)
    name = record.inventory.name
    text = render(name, NodeReading(inventory=record.inventory)).decode()
    parsed = parse_agent_metrics(text, name)
    return _from_telemetry(parsed, FROM_INVENTORY) if parsed is not None else None


class ResourceView(BaseModel):
    """One shard of a replica on one node: reserved by placement against used now."""

    replica: str
    model: str
    node: str
    cores: int
    memory_reserved_mb: int
    memory_used_mb: float | None  # None: not measured (`unmeasured` says why)
    gpu_reserved_mb: int | None  # None: the shard has no GPUs
    gpu_used_mb: float | None
    over: list[str]  # what it uses beyond its reservation, in words; empty within it
    unmeasured: str = ""


def resource_views(
    ledger: LedgerState, telemetry: dict[str, NodeTelemetry | str]
) -> list[ResourceView]:
    """`llmgw model resources`' rows (workers/commands/model_resources.py) for every replica."""
    views = []
    for row in resource_rows(ledger, telemetry):
        views.append(
            ResourceView(
                replica=row.replica,
                model=row.model,
                node=row.node,
                cores=row.cores,
                memory_reserved_mb=row.memory_reserved_mb,
                memory_used_mb=row.rss_bytes / MIB if row.rss_bytes is not None else None,
                gpu_reserved_mb=row.gpu_reserved_mb,
                gpu_used_mb=row.gpu_used_bytes / MIB if row.gpu_used_bytes is not None else None,
                over=row.over(),
                unmeasured=row.unmeasured,
            )
        )
    return views


class HardwareView(BaseModel):
    hostname: str
    os: str
    kernel: str
    arch: str
    nvidia_driver: str
    cuda_version: str
    management_interface: str
    artifact_disk_free_mb: int | None
    problems: list[str]  # discovery steps that failed


def hardware_view(record: NodeRecord) -> HardwareView:
    inv = record.inventory
    return HardwareView(
        hostname=inv.hostname,
        os=inv.os,
        kernel=inv.kernel,
        arch=inv.arch,
        nvidia_driver=inv.nvidia_driver or "",
        cuda_version=inv.cuda_version or "",
        management_interface=inv.management_interface,
        artifact_disk_free_mb=inv.artifact_disk_free_mb,
        problems=list(inv.problems),
    )
