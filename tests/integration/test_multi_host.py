"""llmgw across hosts: each host a Linux network namespace of its own on this machine, cabled to a
switch namespace (tests/integration/netns_hosts.py). Host `ctl` (10.77.0.1) runs Temporal, the
control worker and the gateway; hosts n1, n2 and n3 run an agent each, joined with tokens over
the network. Replicas spread over the hosts and serve through the gateway; a model's weights go
from ctl's mirror to the hosts that run it, each fetching its own copy; a host cut off (its
cable pulled) is unreachable and its route withdrawn, and after the heal it serves from the same
engine process; a host cut off past its grace has its replica placed on another host.

Needs root (CI runs the suite as root); skipped, saying why, where namespaces cannot be made,
unless LLMGW_REQUIRE_NETNS=1 (`make test` sets it when run as root) makes that a failure."""

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.integration.fleet import pid_alive
from tests.integration.multi_host import Cluster, control_plane_in_namespaces
from workflows.contracts import NodeState, ReplicaState

pytestmark = pytest.mark.integration

MODEL = "spread"
MIRRORED = "mirrored"
NODES = ("n1", "n2", "n3")
# Liveness, short for the test: silent LOST_AFTER_S, a node is unreachable. n1's and n2's
# partitions heal well within their GONE_AFTER_S; n3 is cut off past its own, shorter one.
LOST_AFTER_S = 5
GONE_AFTER_S = {"n1": 300, "n2": 300, "n3": 20}


@pytest.fixture(scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    async with control_plane_in_namespaces(tmp_path_factory.mktemp("multi-host")) as cluster:
        for octet, name in enumerate(NODES, start=11):
            cluster.add_node(name, octet, lost_after=LOST_AFTER_S, gone_after=GONE_AFTER_S[name])
        yield cluster


async def nodes_ready(cluster: Cluster, names: tuple[str, ...]) -> bool:
    state = await cluster.ledger()
    return all(
        n in state.nodes
        and state.nodes[n].state == NodeState.READY
        and state.nodes[n].engines.get("llamacpp") is not None
        and state.nodes[n].engines["llamacpp"].state.value == "installed"
        for n in names
    )


async def ready_by_node(cluster: Cluster, model: str = MODEL) -> dict[str, list[str]]:
    state = await cluster.ledger()
    placed: dict[str, list[str]] = {}
    for route in state.routes.values():
        if route.model == model and route.state == ReplicaState.READY:
            placed.setdefault(route.node, []).append(route.replica_id)
    return placed


async def serving(cluster: Cluster, count: int, model: str = MODEL) -> bool:
    """`count` ready replicas in the ledger, each engine answering /health from ctl, and the
    gateway routing to all of them."""
    state = await cluster.ledger()
    ready = [r for r in state.routes.values() if r.model == model and r.state == ReplicaState.READY]
    if len(ready) != count:
        return False
    for route in ready:
        if (await cluster.http("GET", f"{route.endpoint}/health")).get("status") != 200:
            return False
    return await cluster.gateway_ready_replicas(model) == count


async def chats(cluster: Cluster, n: int, tag: str, model: str = MODEL) -> list[int]:
    return [await cluster.chat(model, f"{tag} request {i}") for i in range(n)]


def engine_tokens(metrics: str, replica: str) -> float:
    """The agent's count of the tokens its engine for `replica` has read and written."""
    for line in metrics.splitlines():
        if line.startswith("llmgw_node_engine_tokens") and f'replica="{replica}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_agents_join_over_the_network(cluster: Cluster) -> None:
    await cluster.until(lambda: nodes_ready(cluster, NODES), 120, "three ready nodes")
    state = await cluster.ledger()
    for name in NODES:
        record = state.nodes[name]
        assert record.inventory.address == cluster.nodes[name].host.address
        assert record.labels["host"] == name
    listing = cluster.cli("nodes").stdout
    for name in NODES:
        line = next(line for line in listing.splitlines() if line.startswith(name + " "))
        assert " ready " in line, listing
        assert line.rstrip().endswith("yes"), listing


async def test_replicas_spread_over_hosts_and_serve_through_the_gateway(
    cluster: Cluster, tmp_path: Path
) -> None:
    weights = tmp_path / "standin.gguf"
    weights.write_bytes(b"GGUF stand-in weights")
    cluster.cli("model", "add", MODEL, "--weights", str(weights), "--replicas", "3",
                "--cpu-cores", "1", "--memory-mb", "64")  # fmt: skip
    await cluster.until(lambda: serving(cluster, 3), 120, "three replicas serving")
    placed = await ready_by_node(cluster)
    assert sorted(placed) == list(NODES), placed
    state = await cluster.ledger()
    for name, [replica] in placed.items():
        assert state.routes[replica].endpoint.startswith(
            f"http://{cluster.nodes[name].host.address}:"
        )

    assert await chats(cluster, 9, "spread") == [200] * 9

    async def every_host_served() -> bool:
        for name, [replica] in placed.items():
            if engine_tokens(await cluster.agent_metrics(name), replica) <= 0:
                return False
        return True

    # The gateway takes replicas in turn: every host's engine served, as its agent counts.
    await cluster.until(every_host_served, 30, "every host's engine to count tokens")


async def test_a_model_from_the_mirror_is_fetched_by_its_hosts_over_the_network(
    cluster: Cluster, tmp_path: Path
) -> None:
    weights = tmp_path / "mirrored.gguf"
    weights.write_bytes(b"GGUF " + os.urandom(256 * 1024))
    cluster.cli("model", "add", MIRRORED, "--from", str(weights), "--replicas", "2",
                "--cpu-cores", "1", "--memory-mb", "64")  # fmt: skip
    await cluster.until(lambda: serving(cluster, 2, MIRRORED), 120, "two mirrored replicas")
    placed = await ready_by_node(cluster, MIRRORED)
    assert len(placed) == 2, placed  # one core left on each host: two hosts
    for name, [replica] in placed.items():
        # The host holds its own copy, fetched from ctl's mirror, and its engine runs that copy.
        [fetched] = (cluster.nodes[name].state_dir / "artifacts").glob(f"*/{weights.name}")
        assert fetched.read_bytes() == weights.read_bytes()
        engine = cluster.nodes[name].engine_pids()[replica]
        assert str(fetched).encode() in Path(f"/proc/{engine}/cmdline").read_bytes()
    assert await chats(cluster, 4, "mirrored", MIRRORED) == [200] * 4

    cluster.cli("model", "rm", MIRRORED)

    async def released() -> bool:
        state = await cluster.ledger()
        return not any(a.replica_id.startswith(f"{MIRRORED}-") for a in state.allocations.values())

    await cluster.until(released, 60, "the mirrored model's replicas released")


async def test_a_cut_off_host_is_withdrawn_and_after_the_heal_serves_from_the_same_engine(
    cluster: Cluster,
) -> None:
    [replica] = (await ready_by_node(cluster))["n2"]
    engine = cluster.nodes["n2"].engine_pids()[replica]

    cluster.network.cut("n2")
    try:

        async def withdrawn() -> bool:
            state = await cluster.ledger()
            routes = {r["replica_id"]: r for r in await cluster.gateway_routes()}
            return (
                state.nodes["n2"].state == NodeState.UNREACHABLE
                and routes[replica]["node_unreachable"]
                and await cluster.gateway_ready_replicas(MODEL) == 2
            )

        await cluster.until(withdrawn, 60, "n2 unreachable and its route withdrawn")
        assert await chats(cluster, 6, "cut") == [200] * 6
        assert await cluster.agent_metrics("n2") == "", "n2 answered through a pulled cable"
    finally:
        cluster.network.heal("n2")

    await cluster.until(lambda: serving(cluster, 3), 120, "n2 back and serving")
    assert (await ready_by_node(cluster))["n2"] == [replica]
    assert cluster.nodes["n2"].engine_pids()[replica] == engine, "the engine was restarted"
    assert pid_alive(engine)
    assert await chats(cluster, 6, "healed") == [200] * 6


async def test_a_host_gone_past_its_grace_has_its_replica_placed_elsewhere(
    cluster: Cluster,
) -> None:
    [replica] = (await ready_by_node(cluster))["n3"]
    orphan = cluster.nodes["n3"].engine_pids()[replica]

    cluster.network.cut("n3")
    try:

        async def moved() -> bool:
            state = await cluster.ledger()
            placed = await ready_by_node(cluster)
            return (
                state.nodes["n3"].state == NodeState.LOST
                and "n3" not in placed
                and await serving(cluster, 3)
            )

        await cluster.until(moved, GONE_AFTER_S["n3"] + 90, "n3 lost and its replica moved")
        assert await chats(cluster, 6, "moved") == [200] * 6
        assert pid_alive(orphan), "nobody on n3 could stop it while it was cut off"
    finally:
        cluster.network.heal("n3")

    await cluster.until(lambda: nodes_ready(cluster, ("n3",)), 120, "n3 back")

    async def orphan_stopped() -> bool:
        return not pid_alive(orphan)

    # Its replica workflow ended when it moved: the agent, heard again, stops the engine.
    await cluster.until(orphan_stopped, 120, "n3's orphaned engine stopped")
    placed = await ready_by_node(cluster)
    assert sum(len(v) for v in placed.values()) == 3, placed
    assert "n3" not in placed, placed
