"""The invariants a fleet must hold at every moment, and what "converged" means: pure functions
of a Snapshot (observe.py takes them), so each is unit-tested on hand-made states."""

from collections import Counter
from dataclasses import dataclass, field

from workflows.contracts import LedgerState, NodeState, ReplicaState


@dataclass(frozen=True)
class EngineProcess:
    """A live engine process serving this campaign's weights, as /proc shows it."""

    pid: int
    start_time: int
    port: int | None

    @property
    def identity(self) -> str:
        # A pid alone is reused; with its start time it names one process.
        return f"{self.pid}@{self.start_time}"


@dataclass(frozen=True)
class AgentShard:
    """One of the agent's spec files: the engine it says runs a replica."""

    replica_id: str
    pid: int
    start_time: int
    port: int

    @property
    def identity(self) -> str:
        return f"{self.pid}@{self.start_time}"


@dataclass
class Snapshot:
    taken_at: float  # monotonic, when it was complete
    ledger: LedgerState | None  # None: Temporal or the control worker did not answer
    # Engines alive both before and after the ledger was read, so alive while it was read.
    engines: list[EngineProcess] = field(default_factory=list)
    shards: dict[str, AgentShard] = field(default_factory=dict)
    children: dict[str, bool] = field(default_factory=dict)  # up's processes: running?
    healthy: dict[str, bool] = field(default_factory=dict)  # ready replica -> /health is 200
    gateway_ready: int | None = None  # the gateway's own count of the model's ready replicas


def ledger_violations(state: LedgerState) -> list[str]:
    """What no ledger may ever hold: an engine port, a GPU (by index on its node) or more cores
    or memory than a node has, handed to two shards. Every shard of every allocation counts, so
    a multi-node replica is checked on each of its nodes."""
    ports: Counter[tuple[str, int]] = Counter()
    gpus: Counter[tuple[str, int]] = Counter()
    cores: Counter[str] = Counter()
    memory: Counter[str] = Counter()
    holders: dict[tuple[str, str, int], list[str]] = {}
    for alloc in state.allocations.values():
        for shard in alloc.shards_or_leader():
            ports[(shard.node, shard.port)] += 1
            holders.setdefault(("port", shard.node, shard.port), []).append(alloc.replica_id)
            for gpu in shard.gpus:
                gpus[(shard.node, gpu)] += 1
                holders.setdefault(("gpu", shard.node, gpu), []).append(alloc.replica_id)
            cores[shard.node] += shard.cpu_cores
            memory[shard.node] += shard.memory_mb
    problems = []
    for (node, port), n in ports.items():
        if n > 1:
            problems.append(f"port {port} on {node} held {n} times: {holders['port', node, port]}")
    for (node, gpu), n in gpus.items():
        if n > 1:
            problems.append(f"GPU {gpu} on {node} held {n} times: {holders['gpu', node, gpu]}")
    for node, used in cores.items():
        record = state.nodes.get(node)
        if record is None:
            continue  # a removed node's last allocations are released by their workflows
        if used > record.inventory.cpu_cores:
            has = record.inventory.cpu_cores
            problems.append(f"{used} CPU cores held on {node}, which has {has}")
        if memory[node] > record.inventory.memory_mb:
            problems.append(
                f"{memory[node]} MB held on {node}, which has {record.inventory.memory_mb}"
            )
    return problems


def allocated_ports(state: LedgerState, node: str) -> dict[int, str]:
    """Port -> replica, for every shard the ledger placed on `node`."""
    return {
        shard.port: alloc.replica_id
        for alloc in state.allocations.values()
        for shard in alloc.shards_or_leader()
        if shard.node == node
    }


def agents_vs_ledger(snap: Snapshot, node: str) -> list[str]:
    """Devices in use that the ledger does not count as used: an engine with no allocation (its
    cores or GPUs can be handed to another replica), or one on a port its allocation does not
    name. Only engines alive across the whole ledger read are judged, so an engine starting or
    stopping during the read is never mistaken for one."""
    if snap.ledger is None:
        return []
    ports = allocated_ports(snap.ledger, node)
    problems = []
    for engine in snap.engines:
        if engine.port not in ports:
            problems.append(
                f"engine pid {engine.pid} on port {engine.port} runs with no allocation: "
                "the ledger counts its cores as free"
            )
    running = {e.identity for e in snap.engines}
    for replica, shard in sorted(snap.shards.items()):
        if shard.identity not in running:
            continue
        owner = ports.get(shard.port)
        if owner is not None and owner != replica:
            problems.append(
                f"{replica}'s engine listens on port {shard.port}, allocated to {owner}"
            )
    return problems


def ready_replicas(state: LedgerState, model: str) -> list[str]:
    return sorted(
        r.replica_id
        for r in state.routes.values()
        if r.model == model and r.state == ReplicaState.READY
    )


def duplicates(snap: Snapshot, node: str, model: str, replicas: int) -> list[str]:
    """More of a replica than there should be: more ready replicas than asked for, more engine
    processes than replicas, or two engines on ports of one replica's allocation."""
    problems = []
    if snap.ledger is not None:
        ready = ready_replicas(snap.ledger, model)
        if len(ready) > replicas:
            problems.append(f"{len(ready)} ready replicas of {model}, {replicas} asked: {ready}")
    if len(snap.engines) > replicas:
        pids = sorted(e.pid for e in snap.engines)
        problems.append(f"{len(snap.engines)} engine processes for {replicas} replicas: {pids}")
    if snap.ledger is not None:
        ports = allocated_ports(snap.ledger, node)
        owners = Counter(ports[e.port] for e in snap.engines if e.port in ports)
        problems += [f"{r} has {n} engine processes" for r, n in sorted(owners.items()) if n > 1]
    return problems


def double_booked(snap: Snapshot, node: str) -> list[str]:
    ledger = [] if snap.ledger is None else ledger_violations(snap.ledger)
    return ledger + agents_vs_ledger(snap, node)


def not_converged(snap: Snapshot, node: str, model: str, replicas: int) -> list[str]:
    """Why the system has not converged yet; empty once it has: every process of `up` running,
    the node ready, every replica ready in the ledger, routed by the gateway and answering,
    each with a live engine of the agent's on its allocated port, and nothing double-booked or
    duplicated."""
    waiting = [f"{name} not running" for name, up in sorted(snap.children.items()) if not up]
    if snap.ledger is None:
        return [*waiting, "the ledger does not answer"]
    record = snap.ledger.nodes.get(node)
    if record is None or record.state != NodeState.READY:
        waiting.append(f"node {node} is {record.state.value if record else 'missing'}")
    ready = ready_replicas(snap.ledger, model)
    if len(ready) != replicas:
        waiting.append(f"{len(ready)} of {replicas} replicas ready")
    if snap.gateway_ready != replicas:
        waiting.append(f"the gateway routes to {snap.gateway_ready} replicas")
    running = {e.identity for e in snap.engines}
    ports = allocated_ports(snap.ledger, node)
    for replica in ready:
        shard = snap.shards.get(replica)
        if shard is None or shard.identity not in running:
            waiting.append(f"{replica} has no live engine")
        elif ports.get(shard.port) != replica:
            waiting.append(f"{replica}'s engine is not on its allocated port")
        if not snap.healthy.get(replica, False):
            waiting.append(f"{replica} does not answer /health")
    return waiting + double_booked(snap, node) + duplicates(snap, node, model, replicas)


def engine_changes(
    before: dict[str, str], after: dict[str, str], killed: str | None
) -> tuple[list[str], list[str]]:
    """Replicas whose engine process changed over a round (replica -> engine identity, before
    and after): (restarts of the engine the campaign killed, restarts nobody asked for).
    A replica missing on either side is a lost or new replica, counted elsewhere."""
    expected: list[str] = []
    unwanted: list[str] = []
    for replica in sorted(set(before) & set(after)):
        if before[replica] != after[replica]:
            (expected if replica == killed else unwanted).append(replica)
    return expected, unwanted
