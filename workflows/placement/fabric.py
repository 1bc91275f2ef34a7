"""Which nodes a multi-node replica can span: one NVLink domain, else one InfiniBand fabric,
else RoCE. Never a mix: NCCL is told one fabric per replica (engines/nccl_env.py), and a
shard that cannot reach its peers on it hangs instead of failing.

The same rules as engines/nccl_env.py, restated here because workflows import nothing from
activities; placement is stricter about NVLink (every card joined, IMEX up with a channel).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from workflows.contracts import NodeRecord


@dataclass(frozen=True)
class NodeFabrics:
    nvlink_domain: str | None
    # Why the node's NVLink domain cannot carry a replica ("IMEX not running"), or "".
    nvlink_problem: str
    infiniband: bool
    roce: bool

    def describe(self) -> str:
        parts = []
        if self.nvlink_domain:
            parts.append(f"NVLink domain {self.nvlink_domain}")
        elif self.nvlink_problem:
            parts.append(self.nvlink_problem)
        if self.infiniband:
            parts.append("InfiniBand")
        if self.roce:
            parts.append("RoCE")
        return ", ".join(parts) if parts else "no NVLink domain, InfiniBand or RoCE port"


def node_fabrics(node: NodeRecord) -> NodeFabrics:
    inv = node.inventory
    domains = {g.fabric.domain for g in inv.gpus if g.fabric is not None and g.fabric.joined}
    domain: str | None = None
    problem = ""
    if len(domains) > 1:
        problem = f"GPUs in {len(domains)} NVLink domains"
    elif domains:
        (found,) = domains
        assert found is not None
        if not all(g.fabric is not None and g.fabric.joined for g in inv.gpus):
            # A card out of the domain would carry its share of the traffic over something else.
            problem = f"NVLink domain {found}: not every GPU has joined"
        elif inv.imex is None or not inv.imex.running:
            # Without IMEX the domain's GPUs cannot map each other's memory across nodes.
            detail = f" ({inv.imex.detail})" if inv.imex is not None and inv.imex.detail else ""
            problem = f"NVLink domain {found}: IMEX not running{detail}"
        elif not inv.imex.channels:
            problem = f"NVLink domain {found}: IMEX has no channel"
        else:
            domain = found
    infiniband = any(p.kind == "infiniband" and p.active for p in inv.network_ports)
    # A RoCE port without a RoCE v2 IPv4 GID does not route: NCCL would hang on it.
    roce = any(
        p.kind == "roce" and p.active and p.roce_v2_gid_index is not None for p in inv.network_ports
    )
    return NodeFabrics(domain, problem, infiniband, roce)


@dataclass(frozen=True)
class Group:
    nodes: list[str]  # rank order: the leader first
    fabric: str  # "nvlink", "infiniband" or "roce"
    nvlink_domain: str = ""


def choose_group(
    fits: list[str],
    fabrics: dict[str, NodeFabrics],
    count: int,
    order: Callable[[str], tuple[object, ...]],
    gpus: bool = True,
) -> Group | None:
    """`count` distinct nodes among `fits` sharing one fabric, fastest fabric first; within
    it the nodes `order` puts first (bin-packing). Among NVLink domains the one with the fewest
    fitting nodes wins, so bigger domains stay whole for bigger replicas."""
    ranked = sorted(fits, key=order)
    domains: dict[str, list[str]] = {}
    for name in ranked:
        domain = fabrics[name].nvlink_domain
        # NVLink carries GPU traffic only: a CPU replica's shards talk over the network.
        if domain is not None and gpus:
            domains.setdefault(domain, []).append(name)
    usable = [(len(members), d) for d, members in domains.items() if len(members) >= count]
    if usable:
        _, domain = min(usable)
        return Group(domains[domain][:count], "nvlink", domain)
    for kind in ("infiniband", "roce"):
        members = [n for n in ranked if getattr(fabrics[n], kind)]
        if len(members) >= count:
            return Group(members[:count], kind)
    return None
