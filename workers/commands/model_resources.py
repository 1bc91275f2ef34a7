"""`llmgw model resources [MODEL]`: what placement reserved for each replica beside what its
engine uses now. Reserved is the ledger's allocation (each shard's cores, memory and GPUs, the
GPUs' memory from the node's inventory); used is what each node's agent measures and serves on
its metrics (activities/agent/engine_memory.py): the engine's process group's resident memory,
and the GPU memory its processes hold. A replica that uses more than it reserved is flagged:
placement counted it smaller than it is, and the node may run out of memory."""

from __future__ import annotations

from dataclasses import dataclass

from store.fleet import FleetTables
from workers.node_telemetry import NodeTelemetry, read_agents
from workers.progress import ledger_snapshot
from workers.tables import table
from workflows.contracts import LedgerState

_MIB = 1024 * 1024


@dataclass(frozen=True)
class ResourceRow:
    """One shard of one replica, on one node."""

    replica: str
    model: str
    node: str
    cores: int
    memory_reserved_mb: int
    gpu_reserved_mb: int | None  # None: the shard has no GPUs
    rss_bytes: float | None = None  # None: not measured (no figures from its agent)
    gpu_used_bytes: float | None = None
    unmeasured: str = ""  # why there are no figures

    def over(self) -> list[str]:
        """What it uses beyond its reservation, in words; empty when within it."""
        found = []
        if self.rss_bytes is not None and self.rss_bytes > self.memory_reserved_mb * _MIB:
            found.append(f"memory {mib(self.rss_bytes)} used of {self.memory_reserved_mb} MiB")
        gpu_reserved, gpu_used = self.gpu_reserved_mb, self.gpu_used_bytes
        if gpu_reserved is not None and gpu_used is not None and gpu_used > gpu_reserved * _MIB:
            found.append(f"GPU memory {mib(gpu_used)} used of {gpu_reserved} MiB")
        return found


def mib(value: float) -> str:
    return f"{value / _MIB:.0f} MiB"


def resource_rows(
    state: LedgerState, figures: dict[str, NodeTelemetry | str], model: str | None = None
) -> list[ResourceRow]:
    """Every placed shard (of `model`, or of all), with its agent's figures where it has any."""
    rows = []
    for replica, allocation in sorted(state.allocations.items()):
        if model is not None and allocation.model != model:
            continue
        for shard in allocation.shards_or_leader():
            node = state.nodes.get(shard.node)
            gpus = {g.index: g for g in node.inventory.gpus} if node is not None else {}
            gpu_reserved = sum(gpus[i].memory_mb for i in shard.gpus if i in gpus)
            told = figures.get(shard.node, "its node has no record")
            engine = None
            if isinstance(told, NodeTelemetry):
                engine = next((e for e in told.engines if e.replica == replica), None)
            why = "" if engine is not None else (told if isinstance(told, str) else "not running")
            rows.append(
                ResourceRow(
                    replica=replica,
                    model=allocation.model,
                    node=shard.node,
                    cores=shard.cpu_cores or allocation.cpu_cores,
                    memory_reserved_mb=shard.memory_mb or allocation.memory_mb,
                    gpu_reserved_mb=gpu_reserved if shard.gpus else None,
                    rss_bytes=engine.rss_bytes if engine is not None else None,
                    gpu_used_bytes=engine.gpu_memory_bytes if engine is not None else None,
                    unmeasured=why,
                )
            )
    return rows


def resources_table(rows: list[ResourceRow]) -> str:
    headers = ["REPLICA", "NODE", "CORES", "MEMORY", "GPU MEMORY", "NOTE"]

    def used(value: float | None, reserved: int | None) -> str:
        if reserved is None:
            return "-"
        return f"{'?' if value is None else mib(value)} / {reserved} MiB"

    lines = []
    for row in rows:
        over = row.over()
        note = "OVER: " + "; ".join(over) if over else row.unmeasured
        memory = used(row.rss_bytes, row.memory_reserved_mb)
        gpu = used(row.gpu_used_bytes, row.gpu_reserved_mb)
        lines.append([row.replica, row.node, str(row.cores), memory, gpu, note])
    return table(headers, lines)


async def show_resources(fleet: FleetTables, model: str | None) -> None:
    state = await ledger_snapshot(fleet)
    urls = {name: record.inventory.metrics_url for name, record in state.nodes.items()}
    rows = resource_rows(state, await read_agents(urls), model)
    if not rows:
        print(f"no replica of {model} is placed" if model else "no replica is placed")
        return
    print("used / reserved; used is what the node's agent measures now")
    print(resources_table(rows))
    over = [row for row in rows if row.over()]
    if over:
        print(
            f"{len(over)} shard(s) use more than placement reserved for them: raise the "
            "model's --memory-mb (or its GPU class) so placement counts what it holds"
        )
