"""Silence the control plane caused is no evidence against a node.

A real dev server, frozen with SIGSTOP as a stalled database or a long pause would freeze it,
while an agent keeps heartbeating its liveness watch: when it thaws, the watch's heartbeat
timeout is overdue and no heartbeat arrived in the meantime. The node must not be counted
unreachable (its routes withdrawn) or lost (its replicas replaced) for that: the workflow
probes, and the agent answers the probe at once."""

import asyncio
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from store.fleet import FleetTables, open_fleet
from tests.history_reading import node_states_published
from tests.ports import free_port
from tests.workflows.conftest import (
    binary,
    eventually,
    record_history,
    unique,
)
from tests.workflows.fake_agent import FakeAgent
from workers.agent import register
from workers.control import control_activities
from workers.registry import CONTROL_WORKFLOWS
from workers.search_attributes import ensure_search_attributes
from workflows.contracts import NodeInventory, NodeRegistration, NodeState
from workflows.names import CONTROL_TASK_QUEUE, NodeActivity, node_task_queue, node_workflow_id

GRACE_S = 3.0
GONE_S = 6.0
FREEZE_S = 12.0  # four graces, two gone graces: without a fresh grace the node would be lost


@pytest.fixture
async def dev_server(tmp_path: Path) -> AsyncIterator[tuple[subprocess.Popen[bytes], Client]]:
    port = free_port()
    db = tmp_path / "temporal.db"
    command = [binary("temporal"), "server", "start-dev", "--headless", "--log-level", "error"]
    command += ["--port", str(port), "--ui-port", str(free_port()), "--db-filename", str(db)]
    server = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = None
        for _ in range(100):
            try:
                client = await Client.connect(
                    f"127.0.0.1:{port}", data_converter=pydantic_data_converter
                )
                break
            except Exception:  # noqa: BLE001 - whatever connect raises before the server listens
                await asyncio.sleep(0.2)  # not listening yet: try again
        assert client is not None, "the dev server did not start"
        yield server, client
    finally:
        server.send_signal(signal.SIGCONT)
        server.terminate()
        server.wait(30)


async def watch_heartbeats(client: Client, node: str) -> int:
    """The latest heartbeat Temporal holds for the node's liveness watch (0: none yet)."""
    described = await client.get_workflow_handle(node_workflow_id(node)).describe()
    for pending in described.raw_description.pending_activities:
        details = pending.heartbeat_details.payloads
        if pending.activity_type.name == NodeActivity.WATCH_LIVENESS and details:
            [beat] = await client.data_converter.decode(details)
            return int(beat)
    return 0


@pytest.fixture
async def own_fleet(tmp_path: Path) -> AsyncIterator[FleetTables]:
    """The fleet tables of this test's own control plane."""
    tables = open_fleet(None, tmp_path / "fleet")
    await tables.init()
    yield tables
    await tables.close()


async def test_a_frozen_control_plane_costs_no_node_its_routes_or_replicas(
    dev_server: tuple[subprocess.Popen[bytes], Client], own_fleet: FleetTables, tmp_path: Path
) -> None:
    fleet = own_fleet
    server, client = dev_server
    config = tmp_path / "llmgw.yaml"
    config.write_text("")
    node = unique("frozen")
    agent = FakeAgent(node)
    control = Worker(
        client,
        task_queue=CONTROL_TASK_QUEUE,
        workflows=CONTROL_WORKFLOWS,
        activities=control_activities(client, fleet, config),
    )
    on_node = Worker(client, task_queue=node_task_queue(node), activities=agent.all())
    async with control, on_node:
        await ensure_search_attributes(client)
        reg = NodeRegistration(
            inventory=NodeInventory(name=node, cpu_cores=8, memory_mb=16384),
            boot_id="boot-1",
            lost_after_s=GRACE_S,
            gone_after_s=GONE_S,
        )
        await register(client, reg)

        async def ready() -> bool:
            return await fleet.node_state(node) == NodeState.READY

        await eventually(ready, timeout=30)

        async def heartbeats_landed() -> bool:
            return await watch_heartbeats(client, node) >= 2

        heartbeats_landed.__doc__ = "a few watch heartbeats reached Temporal before the freeze"
        await eventually(heartbeats_landed, timeout=30)
        os.kill(server.pid, signal.SIGSTOP)
        # Sleeps on purpose from here: the freeze lasts this long in real time (the dev
        # server's clock runs on), and then nothing must happen to the node.
        await asyncio.sleep(FREEZE_S)
        os.kill(server.pid, signal.SIGCONT)
        # Long enough for every overdue timeout to fire and a grace to pass again.
        await asyncio.sleep(GONE_S + 2)
        assert await fleet.node_state(node) == NodeState.READY

        # Not even for a moment: every state the node workflow ever published to the tables.
        published = await node_states_published(client, node)
        assert published, "the node published no state"
        assert set(published) == {NodeState.READY.value}, published

        # The node's agent holds a watch again, and heartbeats it.
        assert await watch_heartbeats(client, node) > 0

        # Silence while the control plane is up still counts: the node goes unreachable, then
        # lost.
        agent.silent = True

        async def lost() -> bool:
            return await fleet.node_state(node) == NodeState.LOST

        await eventually(lost, timeout=GONE_S + 10)
        await record_history(client.get_workflow_handle(node_workflow_id(node)), "NodeWatchOutage")
        await client.get_workflow_handle(node_workflow_id(node)).terminate("test over")
