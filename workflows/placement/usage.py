"""What allocations already hold on each node: every shard of every replica counts."""

from __future__ import annotations

from dataclasses import dataclass, field

from workflows.contracts import Allocation, LedgerState, NodeRecord


@dataclass
class NodeUsage:
    """Cores, memory, engine ports and GPUs (GpuInfo.index) reserved on one node."""

    cpu_cores: int = 0
    memory_mb: int = 0
    ports: set[int] = field(default_factory=set)
    gpus: set[int] = field(default_factory=set)
    shards: int = 0  # engine processes: what CPU replicas spread by

    def add(self, alloc: Allocation, node: str) -> None:
        # An allocation from before shards existed is its leader alone (shards_or_leader).
        for shard in alloc.shards_or_leader():
            if shard.node != node:
                continue
            self.cpu_cores += shard.cpu_cores
            self.memory_mb += shard.memory_mb
            self.ports.add(shard.port)
            self.ports.update(shard.extra_ports.values())
            self.gpus.update(shard.gpus)
            self.shards += 1


def node_usage(state: LedgerState, node: str) -> NodeUsage:
    """What every shard of every allocation holds on `node`."""
    usage = NodeUsage()
    for alloc in state.allocations.values():
        usage.add(alloc, node)
    return usage


def free_port(node: NodeRecord, taken: set[int]) -> int | None:
    """The lowest engine port in the node's range no shard holds."""
    for port in range(node.port_min, node.port_max + 1):
        if port not in taken:
            return port
    return None
