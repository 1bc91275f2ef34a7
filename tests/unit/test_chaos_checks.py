"""The invariants `make chaos` samples: devices booked twice (in the ledger, or by an engine the
ledger does not know), replicas duplicated, and what "converged" demands."""

from bench.chaos.checks import (
    AgentShard,
    EngineProcess,
    Snapshot,
    agents_vs_ledger,
    double_booked,
    duplicates,
    engine_changes,
    not_converged,
)
from workflows.contracts import (
    Allocation,
    LedgerState,
    NodeInventory,
    NodeRecord,
    NodeState,
    ReplicaState,
    Route,
    ShardAllocation,
)

NODE, MODEL = "chaos", "smollm2-135m"


def alloc(replica: str, port: int, gpus: list[int] | None = None, cores: int = 1) -> Allocation:
    shard = ShardAllocation(
        node=NODE, address="127.0.0.1", port=port, gpus=gpus or [], cpu_cores=cores, memory_mb=64
    )
    return Allocation(
        replica_id=replica, model=MODEL, node=NODE, address="127.0.0.1", port=port,
        cpu_cores=cores, memory_mb=64, shards=[shard],
    )  # fmt: skip


def route(replica: str, port: int) -> Route:
    return Route(
        replica_id=replica, model=MODEL, node=NODE, endpoint=f"http://127.0.0.1:{port}",
        engine="llamacpp", state=ReplicaState.READY,
    )  # fmt: skip


def ledger(node_state: NodeState = NodeState.READY, **allocs: Allocation) -> LedgerState:
    record = NodeRecord(
        inventory=NodeInventory(name=NODE, cpu_cores=2, memory_mb=4096), state=node_state
    )
    return LedgerState(
        nodes={NODE: record},
        allocations={a.replica_id: a for a in allocs.values()},
        routes={a.replica_id: route(a.replica_id, a.port) for a in allocs.values()},
    )


def engine(pid: int, port: int) -> EngineProcess:
    return EngineProcess(pid=pid, start_time=pid * 10, port=port)


def shard(replica: str, pid: int, port: int) -> AgentShard:
    return AgentShard(replica, pid, pid * 10, port)


def converged_snapshot() -> Snapshot:
    """Two replicas, each with its engine on its allocated port, all answering."""
    return Snapshot(
        taken_at=0.0,
        ledger=ledger(a=alloc(f"{MODEL}-0", 18000), b=alloc(f"{MODEL}-1", 18001)),
        engines=[engine(100, 18000), engine(200, 18001)],
        shards={
            f"{MODEL}-0": shard(f"{MODEL}-0", 100, 18000),
            f"{MODEL}-1": shard(f"{MODEL}-1", 200, 18001),
        },
        children={"temporal": True, "control": True, "agent": True, "gateway": True},
        healthy={f"{MODEL}-0": True, f"{MODEL}-1": True},
        gateway_ready=2,
    )


def test_a_healthy_fleet_has_converged_and_breaks_nothing() -> None:
    snap = converged_snapshot()
    assert not_converged(snap, NODE, MODEL, 2) == []
    assert double_booked(snap, NODE) == []
    assert duplicates(snap, NODE, MODEL, 2) == []


def test_an_engine_the_ledger_does_not_know_double_books_its_cores() -> None:
    """A replica re-placed while its old engine still runs: the ledger has freed the old port's
    cores, but the engine holds them."""
    snap = converged_snapshot()
    snap.engines.append(engine(300, 18002))
    assert agents_vs_ledger(snap, NODE) == [
        "engine pid 300 on port 18002 runs with no allocation: the ledger counts its cores as free"
    ]
    assert duplicates(snap, NODE, MODEL, 2) == [
        "3 engine processes for 2 replicas: [100, 200, 300]"
    ]
    assert not_converged(snap, NODE, MODEL, 2) != []


def test_an_engine_on_another_replicas_port_is_caught() -> None:
    snap = converged_snapshot()
    snap.shards[f"{MODEL}-1"] = shard(f"{MODEL}-1", 200, 18000)
    assert agents_vs_ledger(snap, NODE) == [
        f"{MODEL}-1's engine listens on port 18000, allocated to {MODEL}-0"
    ]


def test_a_dead_spec_is_not_an_engine_and_the_ledger_alone_is_checked_too() -> None:
    snap = converged_snapshot()
    snap.shards["stale"] = shard("stale", 999, 18000)  # its process is gone: judged by no one
    assert agents_vs_ledger(snap, NODE) == []
    assert snap.ledger is not None
    snap.ledger.allocations["x"] = alloc("x", 18003, gpus=[0])
    snap.ledger.allocations["y"] = alloc("y", 18003, gpus=[0])
    assert double_booked(snap, NODE) == [
        f"port 18003 on {NODE} held 2 times: ['x', 'y']",
        f"GPU 0 on {NODE} held 2 times: ['x', 'y']",
        f"4 CPU cores held on {NODE}, which has 2",
    ]


def test_more_ready_replicas_than_asked_is_a_duplicate() -> None:
    snap = converged_snapshot()
    assert snap.ledger is not None
    snap.ledger.routes[f"{MODEL}-2"] = route(f"{MODEL}-2", 18002)
    assert duplicates(snap, NODE, MODEL, 2)[0].startswith("3 ready replicas of smollm2-135m")


def test_not_converged_says_what_it_waits_for() -> None:
    killed = converged_snapshot()
    killed.engines = killed.engines[1:]  # replica 0's engine was just killed
    killed.healthy[f"{MODEL}-0"] = False
    assert not_converged(killed, NODE, MODEL, 2) == [
        f"{MODEL}-0 has no live engine",
        f"{MODEL}-0 does not answer /health",
    ]
    down = converged_snapshot()
    down.ledger, down.children["temporal"] = None, False
    assert not_converged(down, NODE, MODEL, 2) == [
        "temporal not running",
        "the ledger does not answer",
    ]
    cut_off = converged_snapshot()
    assert cut_off.ledger is not None
    cut_off.ledger.nodes[NODE].state = NodeState.UNREACHABLE
    cut_off.gateway_ready = 0
    assert not_converged(cut_off, NODE, MODEL, 2) == [
        f"node {NODE} is unreachable",
        "the gateway routes to 0 replicas",
    ]


def test_engine_changes_tell_asked_restarts_from_unwanted_ones() -> None:
    before = {"m-0": "1@1", "m-1": "2@2", "m-2": "3@3"}
    after = {"m-0": "4@4", "m-1": "5@5", "m-3": "6@6"}  # m-2 lost, m-3 new: counted elsewhere
    assert engine_changes(before, after, killed="m-0") == (["m-0"], ["m-1"])
    assert engine_changes(before, before, killed="m-0") == ([], [])
