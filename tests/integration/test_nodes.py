"""Three nodes on one machine: `llmgw up`'s own agent plus two agents joined with tokens, each a
separate process with its own state dir and address (127.0.0.2, 127.0.0.3), so their engines'
ports cannot collide. One agent is killed; its replicas move; it comes back and reconciles."""

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.fleet import (
    GONE_AFTER_S,
    Agent,
    nodes_ready,
    pid_alive,
    replicas_by_node,
    running_fleet,
)
from tests.system import System, wait_ready
from workers.join import JoinToken
from workflows.contracts import NodeState
from workflows.names import ENGINE_REVERIFY_SCHEDULE_ID

pytestmark = pytest.mark.integration

# `llmgw up`'s system and the joined agents, by node name.
Fleet = tuple[System, dict[str, Agent]]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory) as running:
        yield running


async def chat(http: httpx.AsyncClient, system: System, model: str) -> int:
    response = await http.post(
        f"{system.base_url}/chat/completions",
        headers={"Authorization": f"Bearer {system.api_key}"},
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    )
    return response.status_code


async def test_joined_agents_register_with_their_labels(fleet: Fleet) -> None:
    system, _ = fleet
    everyone = [system.node, "n2", "n3"]
    await system.until(lambda: nodes_ready(system, everyone), 90, "three ready nodes")
    state = await system.ledger()
    assert state.nodes["n2"].labels == {"rack": "n2", "tier": "test"}
    assert state.nodes["n3"].inventory.address == "127.0.0.3"

    listing = system.cli("nodes").stdout
    for name in everyone:
        line = next(line for line in listing.splitlines() if line.startswith(name + " "))
        assert " ready " in line, listing
        assert line.rstrip().endswith("yes"), listing


async def test_a_token_for_another_node_is_refused(fleet: Fleet, tmp_path: Path) -> None:
    system, _ = fleet
    forged = JoinToken(node="n2", temporal=f"127.0.0.1:{system.temporal_port}", secret=b"x" * 32)
    impostor = Agent(system, "n2", "127.0.0.9", tmp_path / "impostor")
    impostor.start(forged.encode())
    assert impostor.process is not None
    assert impostor.process.wait(60) != 0
    assert "joined with another token" in impostor.log.read_text()
    state = await system.ledger()
    assert state.nodes["n2"].inventory.address == "127.0.0.2"


async def test_killed_agent_node_is_lost_its_replicas_move_and_it_reconciles(
    fleet: Fleet, weights: Path
) -> None:
    system, agents = fleet
    await system.until(lambda: nodes_ready(system, [system.node, "n2", "n3"]), 90, "nodes")
    system.cli("model", "add", "spread", "--weights", str(weights), "--replicas", "3",
               "--cpu-cores", "1", "--memory-mb", "64")  # fmt: skip
    await wait_ready(system, "spread", 3)
    placed = await replicas_by_node(system, "spread")
    assert sorted(placed) == sorted([system.node, "n2", "n3"]), placed  # CPU replicas spread
    [on_n2] = placed["n2"]
    orphan = agents["n2"].engine_pids()[on_n2]

    agents["n2"].kill()  # its engine keeps running: engines outlive their agent

    async def moved() -> bool:
        state = await system.ledger()
        now = await replicas_by_node(system, "spread")
        lost = state.nodes["n2"].state == NodeState.LOST
        return lost and "n2" not in now and sum(len(v) for v in now.values()) == 3

    await system.until(moved, GONE_AFTER_S + 60, "n2 lost and its replica moved")
    async with httpx.AsyncClient(timeout=10) as http:
        assert [await chat(http, system, "spread") for _ in range(6)] == [200] * 6
    assert pid_alive(orphan), "nobody on n2 could stop it while its agent was dead"

    agents["n2"].start()
    await system.until(lambda: nodes_ready(system, ["n2"]), 60, "n2 back")

    async def orphan_stopped() -> bool:
        return not pid_alive(orphan)

    # Its replica workflow ended when it moved: the returning agent stops the engine.
    await system.until(orphan_stopped, 30, "the orphaned engine stopped")
    assert sum(len(v) for v in (await replicas_by_node(system, "spread")).values()) == 3


async def test_drain_moves_replicas_without_failing_a_request(fleet: Fleet) -> None:
    system, _ = fleet
    await system.until(lambda: nodes_ready(system, ["n3"]), 60, "n3 ready")
    placed = await replicas_by_node(system, "spread")
    assert "n3" in placed, placed
    failures: list[int] = []
    sent = 0
    stop = asyncio.Event()

    async def load() -> None:
        nonlocal sent
        async with httpx.AsyncClient(timeout=30) as http:
            while not stop.is_set():
                status = await chat(http, system, "spread")
                sent += 1
                if status != 200:
                    failures.append(status)

    traffic = [asyncio.create_task(load()) for _ in range(4)]
    try:
        result = system.cli("node", "drain", "n3", "--reason", "kernel update")
        assert "drain done" in result.stdout

        async def drained() -> bool:
            state = await system.ledger()
            now = await replicas_by_node(system, "spread")
            return state.nodes["n3"].note == "drained" and "n3" not in now

        await system.until(drained, 90, "n3 drained")
    finally:
        stop.set()
        await asyncio.gather(*traffic)
    assert sent > 20
    assert failures == [], f"{len(failures)} of {sent} requests failed during the drain"
    assert sum(len(v) for v in (await replicas_by_node(system, "spread")).values()) == 3
    show = system.cli("node", "show", "n3").stdout
    assert "not placeable: draining" in show or "not placeable: cordoned: drained" in show

    system.cli("node", "uncordon", "n3")
    listing = system.cli("nodes").stdout
    assert (
        next(line for line in listing.splitlines() if line.startswith("n3 "))
        .rstrip()
        .endswith("yes")
    )


async def test_the_fleet_schedules_exist_and_reverify_every_node(fleet: Fleet) -> None:
    system, _ = fleet
    client = await system.client()
    handle = client.get_schedule_handle(ENGINE_REVERIFY_SCHEDULE_ID)
    described = await handle.describe()
    assert described.schedule.spec.intervals[0].every.total_seconds() == 600
    before = {
        n: r.engines["llamacpp"].verified_at for n, r in (await system.ledger()).nodes.items()
    }

    await handle.trigger()

    async def verified_again() -> bool:
        state = await system.ledger()
        return all(
            state.nodes[n].engines["llamacpp"].verified_at > before[n]
            for n in before
            if state.nodes[n].state == NodeState.READY
        )

    await system.until(verified_again, 60, "every ready node re-verified")


async def test_a_removed_nodes_agent_stops_its_engines_and_exits(fleet: Fleet) -> None:
    """Last in this module: it takes n2 out of the fleet. The agent learns of the removal only
    by asking Temporal once its liveness watch has stopped coming (workers/agent.py)."""
    system, agents = fleet
    agent = agents["n2"]
    assert agent.process is not None
    assert agent.process.poll() is None
    engines = [pid for pid in agent.engine_pids().values() if pid_alive(pid)]
    system.cli("node", "rm", "n2", "--force", "--reason", "decommissioned")

    async def exited() -> bool:
        return agent.process is not None and agent.process.poll() is not None

    await system.until(exited, 60, "n2's agent exited")
    assert agent.process.returncode == 0  # systemd's Restart=on-failure leaves it stopped
    assert not [pid for pid in engines if pid_alive(pid)], "its engines were stopped"
