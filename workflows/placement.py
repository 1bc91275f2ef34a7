"""Where a replica goes: filter the nodes, then score the rest. Pure: data in, data out.

Every node that is filtered out gets a reason in its own words, so an operator can be told why
a model did not land ("llamacpp installing: building llama-server 45%").
"""

from workflows.contracts import (
    Allocation,
    EngineState,
    LedgerState,
    NodeRecord,
    NodeState,
    PlacementRefused,
    PlacementRequest,
)


def node_usage(state: LedgerState, node: str) -> tuple[int, int, set[int]]:
    """CPU cores, memory and ports already reserved on a node."""
    cores = memory = 0
    ports: set[int] = set()
    for alloc in state.allocations.values():
        if alloc.node == node:
            cores += alloc.cpu_cores
            memory += alloc.memory_mb
            ports.add(alloc.port)
    return cores, memory, ports


def why_not(state: LedgerState, node: NodeRecord, req: PlacementRequest) -> str | None:
    """The reason this node cannot take the replica, or None when it can."""
    if node.state != NodeState.READY:
        return f"node is {node.state.value}"
    if node.cordoned:
        why = "draining" if node.draining else "cordoned"
        return f"node is {why}" + (f" ({node.note})" if node.note else "")
    engine = node.engines.get(req.engine)
    if engine is None:
        return f"{req.engine} is not installed"
    if engine.state != EngineState.INSTALLED:
        detail = f": {engine.detail}" if engine.detail else ""
        return f"{req.engine} {engine.state.value}{detail}"
    if req.engine_version and engine.version != req.engine_version:
        return f"{req.engine} {engine.version} installed, {req.engine_version} wanted"
    cores, memory, ports = node_usage(state, node.inventory.name)
    free_cores = node.inventory.cpu_cores - cores
    if free_cores < req.cpu_cores:
        return f"{free_cores} of {node.inventory.cpu_cores} CPU cores free, {req.cpu_cores} wanted"
    free_memory = node.inventory.memory_mb - memory
    if free_memory < req.memory_mb:
        return f"{free_memory} MB memory free, {req.memory_mb} MB wanted"
    if free_port(node, ports) is None:
        return "no free engine port"
    return None


def free_port(node: NodeRecord, taken: set[int]) -> int | None:
    for port in range(node.port_min, node.port_max + 1):
        if port not in taken:
            return port
    return None


def place(state: LedgerState, req: PlacementRequest) -> Allocation | PlacementRefused:
    """Choose a node for a CPU replica. CPU replicas spread: the node with the fewest replicas
    wins, then the most free cores, then the name, so the choice is deterministic."""
    existing = state.allocations.get(req.replica_id)
    if existing is not None:
        return existing  # placement is idempotent per replica: a retried call gets the same node
    reasons: dict[str, str] = {}
    candidates: list[tuple[int, int, str]] = []
    for name, node in sorted(state.nodes.items()):
        reason = why_not(state, node, req)
        if reason is not None:
            reasons[name] = reason
            continue
        cores, _, _ = node_usage(state, name)
        replicas = sum(1 for a in state.allocations.values() if a.node == name)
        candidates.append((replicas, -(node.inventory.cpu_cores - cores), name))
    if not candidates:
        if not reasons:
            reasons["(cluster)"] = "no nodes have registered"
        return PlacementRefused(replica_id=req.replica_id, reasons=reasons)
    _, _, chosen = min(candidates)
    node = state.nodes[chosen]
    _, _, ports = node_usage(state, chosen)
    port = free_port(node, ports)
    assert port is not None  # why_not checked it
    return Allocation(
        replica_id=req.replica_id,
        workflow_id=req.workflow_id,
        model=req.model,
        node=chosen,
        address=node.inventory.address,
        port=port,
        cpu_cores=req.cpu_cores,
        memory_mb=req.memory_mb,
    )
