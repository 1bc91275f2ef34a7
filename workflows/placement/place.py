"""place() and explain(): filter the nodes, then score the rest, one profile at a time."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from workflows.contracts import (
    Allocation,
    LedgerState,
    ModelSpec,
    PlacementRefused,
    PlacementRequest,
    Profile,
    ShardAllocation,
)
from workflows.placement.checks import choose_gpus, free_gpus, profile_label, why_not
from workflows.placement.disk import MB, holds, must_fetch, size_text
from workflows.placement.fabric import choose_group, node_fabrics
from workflows.placement.ports import extra_port_names, free_ports
from workflows.placement.usage import NodeUsage, cluster_usage

CLUSTER = "(cluster)"
NO_NODES = "no nodes have registered"
# explain() places nothing, so its probe must not match an allocation (idempotence would answer).
_PROBE = "(explain)"


def place(state: LedgerState, req: PlacementRequest) -> Allocation | PlacementRefused:
    """Place one replica: the first of its profiles that fits somewhere wins.

    Idempotent per replica id: a retried call gets the allocation it already has.
    """
    existing = state.allocations.get(req.replica_id)
    if existing is not None:
        return existing
    if not state.nodes:
        return PlacementRefused(replica_id=req.replica_id, reasons={CLUSTER: NO_NODES})
    usage = cluster_usage(state)
    refusals: list[dict[str, str]] = []
    for index, profile in enumerate(req.profiles):
        alloc, reasons = _try(state, usage, req, index, profile, req.exclude_nodes)
        if alloc is not None:
            return alloc
        refusals.append(reasons)
    return PlacementRefused(replica_id=req.replica_id, reasons=_merge(req.profiles, refusals))


def explain(state: LedgerState, model: ModelSpec | Sequence[Profile]) -> list[str]:
    """For `llmgw model why`: each profile, where it would go now, and each node's reason (or
    "fits", and for a model whose weights are in the mirror whether the node holds them or
    must fetch them first). Reserves nothing."""
    if isinstance(model, ModelSpec):
        profiles, artifact, size = model.profiles, model.artifact, model.artifact_size
    else:
        profiles, artifact, size = list(model), "", 0
    if not state.nodes:
        return [NO_NODES]
    usage = cluster_usage(state)
    probe = PlacementRequest(
        replica_id=_PROBE, model="", profiles=profiles, artifact=artifact, artifact_size=size
    )
    lines: list[str] = []
    for index, profile in enumerate(profiles):
        alloc, reasons = _try(state, usage, probe, index, profile, ())
        head = f"profile {index + 1} ({profile_label(profile)})"
        chosen = [s.node for s in alloc.shards] if alloc is not None else []
        if alloc is None:
            lines.append(f"{head}: fits nowhere")
        else:
            over = f" over {alloc.fabric}" if alloc.fabric else ""
            lines.append(f"{head}: would go to {', '.join(chosen)}{over}")
        for name in sorted(state.nodes):
            reason = reasons.get(name) or _fits(state, name, chosen, artifact, size)
            lines.append(f"  {name}: {reason}")
        if CLUSTER in reasons:
            lines.append(f"  {CLUSTER}: {reasons[CLUSTER]}")
    return lines


def _fits(state: LedgerState, name: str, chosen: list[str], artifact: str, size: int) -> str:
    """A node that can take the replica, and whether it holds the weights or must fetch them;
    one that must and was not chosen when a holder was is said to be passed over for it."""
    if not artifact:
        return "fits"
    if holds(state.nodes[name], artifact):
        return "fits, holds the weights"
    amount = f" ({size_text((size + MB // 2) // MB)})" if size else ""
    if name not in chosen and any(holds(state.nodes[c], artifact) for c in chosen):
        return f"fits, but would fetch the weights{amount}: passed over for a node holding them"
    return f"fits, would fetch the weights first{amount}"


def _merge(profiles: Sequence[Profile], refusals: list[dict[str, str]]) -> dict[str, str]:
    """One line per node; with several profiles it says which profile each reason is for."""
    if len(refusals) == 1:
        return refusals[0]
    keys = sorted({k for r in refusals for k in r}, key=lambda k: (k == CLUSTER, k))
    merged: dict[str, str] = {}
    for key in keys:
        parts = [
            f"profile {i + 1} ({profile_label(profiles[i])}): {r[key]}"
            for i, r in enumerate(refusals)
            if key in r
        ]
        merged[key] = "; ".join(parts)
    return merged


def _try(
    state: LedgerState,
    usage: dict[str, NodeUsage],
    req: PlacementRequest,
    index: int,
    profile: Profile,
    exclude: Collection[str],
) -> tuple[Allocation | None, dict[str, str]]:
    """The allocation for this profile, or None; and why each node that cannot take it can't."""
    empty = NodeUsage()
    reasons: dict[str, str] = {}
    fits: list[str] = []
    for name, node in sorted(state.nodes.items()):
        busy = req.exclude_ports.get(name, ())
        used = usage.get(name, empty)
        reason = why_not(node, profile, used, exclude, busy, req.artifact, req.artifact_size)
        if reason is None:
            fits.append(name)
        else:
            reasons[name] = reason

    def order(name: str) -> tuple[object, ...]:
        used = usage.get(name, empty)
        # First the nodes holding the model's weights: the others must fetch them first.
        fetch = must_fetch(state.nodes[name], req.artifact)
        if profile.gpu_class is not None:
            # GPU replicas bin-pack: the tightest node that fits, keeping whole nodes free for
            # replicas that need all of one.
            free = len(free_gpus(state.nodes[name], profile.gpu_class, used.gpus))
            return (fetch, free, name)
        # CPU replicas spread: nothing stops two sharing cores, so fewer neighbours is faster.
        free_cores = state.nodes[name].inventory.cpu_cores - used.cpu_cores
        return (fetch, used.shards, -free_cores, name)

    if not fits:
        return None, reasons
    if profile.nodes == 1:
        chosen, fabric, domain = [min(fits, key=order)], "", ""
    else:
        fabrics = {name: node_fabrics(state.nodes[name]) for name in fits}
        group = choose_group(fits, fabrics, profile.nodes, order, profile.gpu_class is not None)
        if group is None:
            for name in fits:
                reasons[name] = (
                    f"fits, but shares no fabric with enough others ({fabrics[name].describe()})"
                )
            if profile.gpu_class is not None:
                what = f"{profile.gpus_per_node} free {profile.gpu_class} each"
            else:
                cores = profile.cpu_cores
                what = f"{cores} free CPU core{'s' if cores > 1 else ''} each"
            reasons[CLUSTER] = (
                f"no NVLink domain or fabric has {profile.nodes} nodes with {what} "
                f"({len(fits)} of {len(state.nodes)} nodes fit alone)"
            )
            return None, reasons
        chosen, fabric, domain = group.nodes, group.fabric, group.nvlink_domain
    return _allocate(state, usage, req, index, profile, chosen, fabric, domain), reasons


def _allocate(
    state: LedgerState,
    usage: dict[str, NodeUsage],
    req: PlacementRequest,
    index: int,
    profile: Profile,
    chosen: list[str],
    fabric: str,
    domain: str,
) -> Allocation:
    assert len(set(chosen)) == len(chosen) == profile.nodes
    shards: list[ShardAllocation] = []
    for rank, name in enumerate(chosen):
        node = state.nodes[name]
        used = usage.get(name, NodeUsage())
        names = extra_port_names(profile, rank)
        ports = free_ports(node, used.ports, 1 + len(names), req.exclude_ports.get(name, ()))
        assert ports is not None, "why_not checked it"
        port, *extra = ports
        gpus = choose_gpus(node, profile, used.gpus) if profile.gpu_class is not None else []
        shards.append(
            ShardAllocation(
                node=name,
                address=node.inventory.address,
                port=port,
                rank=rank,
                gpus=[g.index for g in gpus],
                gpu_uuids=[g.uuid for g in gpus],
                cpu_cores=profile.cpu_cores,
                memory_mb=profile.memory_mb,
                extra_ports=dict(zip(names, extra, strict=True)),
            )
        )
    leader = shards[0]
    return Allocation(
        replica_id=req.replica_id,
        workflow_id=req.workflow_id,
        model=req.model,
        node=leader.node,
        address=leader.address,
        port=leader.port,
        cpu_cores=profile.cpu_cores,
        memory_mb=profile.memory_mb,
        profile_index=index,
        shards=shards,
        fabric=fabric,
        nvlink_domain=domain,
    )
