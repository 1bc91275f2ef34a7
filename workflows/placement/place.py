"""place() and explain(): filter the nodes, then score the rest, one profile at a time."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence

from workflows.contracts import (
    Allocation,
    LedgerState,
    ModelSpec,
    PlacementRefused,
    PlacementRequest,
    Profile,
    ShardAllocation,
)
from workflows.placement.checks import choose_gpus, profile_label, why_not
from workflows.placement.disk import MB, holds, must_fetch, size_text
from workflows.placement.fabric import choose_group
from workflows.placement.index import EMPTY, PlacementIndex
from workflows.placement.ports import extra_port_names, free_ports

CLUSTER = "(cluster)"
NO_NODES = "no nodes have registered"
# explain() places nothing, so its probe must not match an allocation (idempotence would answer).
_PROBE = "(explain)"


def place(
    state: LedgerState, req: PlacementRequest, index: PlacementIndex | None = None
) -> Allocation | PlacementRefused:
    """Place one replica: the first of its profiles that fits somewhere wins.

    Idempotent per replica id: a retried call gets the allocation it already has. `index`:
    the caller's PlacementIndex of `state` (the ledger keeps one); built here when not given.
    A placement checks only the nodes it would prefer until one fits; only a refusal checks
    every node, for every node's reason.
    """
    if index is None:
        index = PlacementIndex(state)
    alloc = first_fit(state, req, index)
    if alloc is not None:
        return alloc
    if not state.nodes:
        return PlacementRefused(replica_id=req.replica_id, reasons={CLUSTER: NO_NODES})
    refusals: list[dict[str, str]] = []
    for number, profile in enumerate(req.profiles):
        alloc, reasons = _try(state, index, req, number, profile, req.exclude_nodes)
        if alloc is not None:  # _first_fit and _try agree (tests hold them to it)
            return alloc
        refusals.append(reasons)
    return PlacementRefused(replica_id=req.replica_id, reasons=_merge(req.profiles, refusals))


def first_fit(
    state: LedgerState, req: PlacementRequest, index: PlacementIndex
) -> Allocation | None:
    """place() without the reasons: where the replica would go (or went: a retry), None when
    it fits nowhere. A cell's offer asks only this (workflows/ledger_cells.py): the reasons
    check every node, and are wanted only when no cell can take it."""
    existing = state.allocations.get(req.replica_id)
    if existing is not None:
        return existing
    for number, profile in enumerate(req.profiles):
        alloc = _first_fit(state, index, req, number, profile)
        if alloc is not None:
            return alloc
    return None


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
    index = PlacementIndex(state)
    probe = PlacementRequest(
        replica_id=_PROBE, model="", profiles=profiles, artifact=artifact, artifact_size=size
    )
    lines: list[str] = []
    for number, profile in enumerate(profiles):
        alloc, reasons = _try(state, index, probe, number, profile, ())
        head = f"profile {number + 1} ({profile_label(profile)})"
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


def _order(
    state: LedgerState, index: PlacementIndex, req: PlacementRequest, profile: Profile
) -> Callable[[str], tuple[object, ...]]:
    """Which fitting node placement prefers: the smallest key wins."""

    def order(name: str) -> tuple[object, ...]:
        used = index.used(name)
        # First the nodes holding the model's weights: the others must fetch them first.
        fetch = must_fetch(state.nodes[name], req.artifact)
        if profile.gpu_class is not None:
            # GPU replicas bin-pack: the tightest node that fits, keeping whole nodes free for
            # replicas that need all of one.
            return (
                fetch,
                index.free_gpu_count(name, profile.gpu_class),
                index.tiebreak(name),
                name,
            )
        # CPU replicas spread: nothing stops two sharing cores, so fewer neighbours is faster.
        free_cores = state.nodes[name].inventory.cpu_cores - used.cpu_cores
        return (fetch, used.shards, -free_cores, index.tiebreak(name), name)

    return order


def _preferred(
    state: LedgerState, index: PlacementIndex, req: PlacementRequest, profile: Profile
) -> Iterator[str]:
    """The nodes that may fit, in _order's order: for a GPU profile only those with enough
    free GPUs of its class (why_not refuses the rest whatever else they have)."""

    def walk() -> Iterator[str]:
        if profile.gpu_class is not None:
            return (name for _, name in index.gpu_nodes(profile.gpu_class, profile.gpus_per_node))
        return (key[-1] for key in index.cpu_nodes())

    if not req.artifact:
        yield from walk()
        return
    yield from (name for name in walk() if not must_fetch(state.nodes[name], req.artifact))
    yield from (name for name in walk() if must_fetch(state.nodes[name], req.artifact))


def _first_fit(
    state: LedgerState, index: PlacementIndex, req: PlacementRequest, number: int, profile: Profile
) -> Allocation | None:
    """What _try allocates for this profile, found by checking nodes in the order placement
    prefers them and stopping at the first that fits (one node), or checking only the nodes
    that may fit (several); None where _try would refuse. No reasons: a refusal asks _try."""

    def fits(name: str) -> bool:
        node = state.nodes[name]
        busy = req.exclude_ports.get(name, ())
        used = index.used(name)
        exclude = req.exclude_nodes
        return why_not(node, profile, used, exclude, busy, req.artifact, req.artifact_size) is None

    if profile.nodes == 1:
        for name in _preferred(state, index, req, profile):
            if fits(name):
                return _allocate(state, index, req, number, profile, [name], "", "")
        return None
    question = (profile.model_dump_json(), req.artifact, req.artifact_size)

    def fits_here(name: str) -> bool:
        if index.used(name) is EMPTY and name not in req.exclude_ports:
            # An idle node is judged on its record and the question alone: remembered.
            checked = name not in req.exclude_nodes
            return checked and index.idle_verdict(name, question, lambda: fits(name))
        return fits(name)

    may = list(_preferred(state, index, req, profile))
    fabrics = {name: index.fabrics(state.nodes[name]) for name in may}
    order = _order(state, index, req, profile)
    gpus = profile.gpu_class is not None
    group = None
    if gpus:
        # An NVLink domain wins over any network, and choose_group reads only the nodes in
        # one to find it: check those first, the rest only when no domain has room.
        in_domain = [n for n in may if fabrics[n].nvlink_domain is not None and fits_here(n)]
        group = choose_group(in_domain, fabrics, profile.nodes, order, gpus)
    if group is None:
        fitting = [name for name in may if fits_here(name)]
        group = choose_group(fitting, fabrics, profile.nodes, order, gpus)
    if group is None:
        return None
    chosen, fabric, domain = group.nodes, group.fabric, group.nvlink_domain
    return _allocate(state, index, req, number, profile, chosen, fabric, domain)


def _try(
    state: LedgerState,
    index: PlacementIndex,
    req: PlacementRequest,
    number: int,
    profile: Profile,
    exclude: Collection[str],
) -> tuple[Allocation | None, dict[str, str]]:
    """The allocation for this profile, or None; and why each node that cannot take it can't.
    Checks every node: for a refusal and for `llmgw model why`."""
    reasons: dict[str, str] = {}
    fits: list[str] = []
    for name, node in sorted(state.nodes.items()):
        busy = req.exclude_ports.get(name, ())
        used = index.used(name)
        reason = why_not(node, profile, used, exclude, busy, req.artifact, req.artifact_size)
        if reason is None:
            fits.append(name)
        else:
            reasons[name] = reason
    order = _order(state, index, req, profile)
    if not fits:
        return None, reasons
    if profile.nodes == 1:
        chosen, fabric, domain = [min(fits, key=order)], "", ""
    else:
        fabrics = {name: index.fabrics(state.nodes[name]) for name in fits}
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
    return _allocate(state, index, req, number, profile, chosen, fabric, domain), reasons


def _allocate(
    state: LedgerState,
    index: PlacementIndex,
    req: PlacementRequest,
    number: int,
    profile: Profile,
    chosen: list[str],
    fabric: str,
    domain: str,
) -> Allocation:
    assert len(set(chosen)) == len(chosen) == profile.nodes
    shards: list[ShardAllocation] = []
    for rank, name in enumerate(chosen):
        node = state.nodes[name]
        used = index.used(name)
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
        profile_index=number,
        shards=shards,
        fabric=fabric,
        nvlink_domain=domain,
    )
