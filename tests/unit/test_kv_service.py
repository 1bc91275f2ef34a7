"""The agent's KV feed as the agent process runs it: subscriptions that follow the engines the
supervisor records, and a feed port that cannot be had turning the feed off, not the agent."""

import socket
import sys
import time
import uuid
from pathlib import Path

import aiohttp

from activities.agent.config import AgentConfig
from activities.agent.kv.feed_server import STATUS_PATH
from activities.agent.kv.service import KvService, live_publishers
from activities.agent.supervisor import ShardSupervisor
from engines.adapter import KvPublisher
from tests.ports import free_port
from tests.unit.kv_publisher_standin import until
from workflows.engine_keys import kv_feed_token

SECRET = b"node-secret-for-tests-0123456789"


def config(tmp_path: Path, feed_port: int) -> AgentConfig:
    return AgentConfig(
        node="node-a",
        address="127.0.0.1",
        state_dir=tmp_path / "state",
        cache_dir=tmp_path / "cache",
        node_secret=SECRET,
        kv_feed_port=feed_port,
    )


def publisher(replica: str) -> KvPublisher:
    return KvPublisher(
        f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}", replica, 16, "0"
    )


SLEEP = "import time; time.sleep(300)"


def engine(sup: ShardSupervisor, replica: str, kv: KvPublisher | None, code: str = SLEEP) -> None:
    command = [sys.executable, "-c", code, uuid.uuid4().hex]
    sup.launch(replica, f"replica:{replica}", command, {}, "fp", free_port(), kv_publisher=kv)


def test_only_running_engines_with_a_publisher_are_subscribed_to(
    supervisor: ShardSupervisor,
) -> None:
    publishing = publisher("m-0")
    engine(supervisor, "m-0", publishing)
    engine(supervisor, "m-1", None)  # llama.cpp, or vLLM without kv_events
    engine(supervisor, "m-2", publisher("m-2"), code="pass")  # ends at once; its spec stays
    deadline = time.monotonic() + 10
    while supervisor.is_alive("m-2"):
        assert time.monotonic() < deadline, "the engine that exits at once still runs"
        time.sleep(0.02)
    assert [s.replica_id for s in supervisor.shards()] == ["m-0", "m-1", "m-2"]
    assert live_publishers(supervisor) == {"m-0": publishing}


async def test_the_feed_follows_engines_as_they_start_and_stop(
    tmp_path: Path, supervisor: ShardSupervisor
) -> None:
    service = KvService(config(tmp_path, free_port()))
    await service.start(supervisor)
    try:
        engine(supervisor, "m-0", publisher("m-0"))
        service.poke()  # what a start_engine does: no waiting for the next round
        await until(lambda: "m-0" in service.hub.status()["replicas"])  # type: ignore[operator]

        port = service._config.kv_feed_port
        headers = {"Authorization": f"Bearer {kv_feed_token(SECRET)}"}
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}{STATUS_PATH}", headers=headers) as response,
        ):
            status = await response.json()
        assert status["replicas"]["m-0"]["subscribed"] is True

        supervisor.stop("m-0", grace_s=1.0)
        service.poke()
        await until(lambda: "m-0" not in service.hub.status()["replicas"])  # type: ignore[operator]
    finally:
        await service.stop()


async def test_a_feed_port_already_taken_turns_the_feed_off_not_the_agent(
    tmp_path: Path, supervisor: ShardSupervisor
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        agent_config = config(tmp_path, taken.getsockname()[1])
        service = KvService(agent_config)
        await service.start(supervisor)
        await service.stop()
    assert agent_config.kv_feed_port == 0  # launches now report no KV source
