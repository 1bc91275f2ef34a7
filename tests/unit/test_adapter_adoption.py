"""A replica whose adapters changed while its engine ran launches again (after an agent
restart, say): its engine is adopted, not restarted, when nothing but the adapters changed,
and ends up serving the new list, loaded at once or, while it still loads, once it is ready.
Anything else changed still restarts it; a spec written before restart fingerprints were
recorded still adopts on an equal fingerprint.

The engine's process is a stand-in script (only its pid matters); what it serves is the
stand-in vLLM of test_adapter_loading.py, on the replica's port."""

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import asdict
from pathlib import Path

import pytest
from aiohttp import web
from temporalio.testing import ActivityEnvironment

from activities.agent.node_agent import AgentConfig, NodeAgentActivities
from activities.agent.supervisor import ShardSupervisor
from tests.ports import free_port
from tests.unit.test_adapter_loading import REPLICA, SECRET, StandinVllm, standin_app
from workflows.contracts import (
    Allocation,
    LaunchRequest,
    LoraAdapter,
    ModelSpec,
    Profile,
    ReadyRequest,
    SetAdaptersRequest,
    ShardAllocation,
)
from workflows.placement.ports import KV_PUB, KV_REPLAY

SQL = LoraAdapter(name="sql", path="/a/sql")
POEM = LoraAdapter(name="poem", path="/a/poem")


def make_agent(tmp_path: Path, own_ports: set[int] | None = None) -> NodeAgentActivities:
    fake_vllm = tmp_path / "vllm"  # stands in for `vllm serve`: only its process matters
    fake_vllm.write_text("#!/bin/sh\nexec sleep 300\n")
    fake_vllm.chmod(0o755)
    config = AgentConfig(
        node="node-a",
        address="127.0.0.1",
        state_dir=tmp_path / "state",
        cache_dir=tmp_path / "cache",
        node_secret=SECRET,
        engine_paths={"vllm": str(fake_vllm)},
        nvidia=False,
        kv_feed_port=free_port(),
        ready_poll_s=0.1,
        stop_grace_s=2.0,
    )
    return NodeAgentActivities(config, own_ports=lambda: own_ports or set())


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[NodeAgentActivities]:
    acts = make_agent(tmp_path)
    yield acts
    acts.stop_all_engines()


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    path = tmp_path / "m.safetensors"
    path.write_bytes(b"weights")
    return path


class Replica:
    """Launch requests for one vLLM replica publishing KV events, on fixed ports."""

    def __init__(self, weights: Path) -> None:
        self.weights = weights
        self.port, self.kv_pub, self.kv_replay = free_port(), free_port(), free_port()

    def model(self, *lora: LoraAdapter, context_size: int = 4096) -> ModelSpec:
        profile = Profile(
            engine="vllm",
            engine_version="0.11.0",
            kv_events=True,
            cpu_cores=2,
            lora=list(lora),
            context_size=context_size,
        )
        return ModelSpec(name="m", weights=str(self.weights), profiles=[profile])

    def launch(self, model: ModelSpec) -> LaunchRequest:
        shard = ShardAllocation(
            node="node-a",
            address="127.0.0.1",
            port=self.port,
            cpu_cores=2,
            extra_ports={KV_PUB: self.kv_pub, KV_REPLAY: self.kv_replay},
        )
        allocation = Allocation(
            replica_id=REPLICA,
            node="node-a",
            address="127.0.0.1",
            port=self.port,
            cpu_cores=2,
            memory_mb=1024,
            shards=[shard],
        )
        return LaunchRequest(
            replica_id=REPLICA, workflow_id="replica:m:0", model=model, allocation=allocation
        )


@asynccontextmanager
async def serving(port: int, adapters: dict[str, str]) -> AsyncIterator[StandinVllm]:
    """The stand-in vLLM answering on the engine's port, serving `adapters`."""
    engine = StandinVllm(adapters=dict(adapters), port=port)
    runner = web.AppRunner(standin_app(engine))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield engine
    finally:
        await runner.cleanup()


async def test_only_new_adapters_keep_the_engine_and_load_them(
    agent: NodeAgentActivities, weights: Path
) -> None:
    replica = Replica(weights)
    env = ActivityEnvironment()
    first = await env.run(agent.start_engine, replica.launch(replica.model(SQL)))
    assert not first.adopted
    new = replica.model(POEM)
    async with serving(replica.port, {"sql": "/a/sql"}) as vllm:
        again = await env.run(agent.start_engine, replica.launch(new))
        assert again.adopted
        assert again.pid == first.pid
        assert vllm.adapters == {"poem": "/a/poem"}
    # The gateway hashes the adapter's KV blocks with what the engine serves now.
    assert again.kv is not None
    assert again.kv.adapters == {"poem": "/a/poem"}
    spec = agent.supervisor.read_spec(REPLICA)
    assert spec is not None
    assert spec.fingerprint == new.profile_fingerprint(0)
    assert spec.pending_adapters is None
    publisher = spec.publisher()
    assert publisher is not None
    assert publisher.adapters == (("poem", "/a/poem"),)

    # Launched again with the same list (a retry): adopted, nothing more to load.
    third = await env.run(agent.start_engine, replica.launch(new))
    assert (third.adopted, third.pid) == (True, first.pid)

    # node_set_adapters records what it loaded too: a later adoption's route names it.
    async with serving(replica.port, {"poem": "/a/poem"}) as vllm:
        await env.run(
            agent.set_adapters, SetAdaptersRequest(replica_id=REPLICA, model="m", adapters=[SQL])
        )
        assert vllm.adapters == {"sql": "/a/sql"}
    spec = agent.supervisor.read_spec(REPLICA)
    assert spec is not None
    publisher = spec.publisher()
    assert publisher is not None
    assert publisher.adapters == (("sql", "/a/sql"),)


async def test_a_change_beyond_the_adapters_still_restarts_the_engine(
    agent: NodeAgentActivities, weights: Path
) -> None:
    replica = Replica(weights)
    env = ActivityEnvironment()
    first = await env.run(agent.start_engine, replica.launch(replica.model(SQL)))
    changed = replica.model(POEM, context_size=2048)
    second = await env.run(agent.start_engine, replica.launch(changed))
    assert not second.adopted
    assert second.pid != first.pid
    spec = agent.supervisor.read_spec(REPLICA)
    assert spec is not None
    assert spec.fingerprint == changed.profile_fingerprint(0)


async def test_an_engine_still_loading_takes_its_adapters_once_ready(
    agent: NodeAgentActivities, weights: Path
) -> None:
    replica = Replica(weights)
    env = ActivityEnvironment()
    old = replica.model(SQL)
    first = await env.run(agent.start_engine, replica.launch(old))
    new = replica.model(SQL, POEM)
    # Nothing answers on its port yet: adopted, with the new list pending.
    adopted = await env.run(agent.start_engine, replica.launch(new))
    assert (adopted.adopted, adopted.pid) == (True, first.pid)
    assert adopted.kv is not None
    assert adopted.kv.adapters == {"sql": "/a/sql", "poem": "/a/poem"}
    spec = agent.supervisor.read_spec(REPLICA)
    assert spec is not None
    assert spec.pending_adapters == {"sql": "/a/sql", "poem": "/a/poem"}
    assert spec.fingerprint == old.profile_fingerprint(0)

    async with serving(replica.port, {"sql": "/a/sql"}) as vllm:
        ready = await env.run(agent.wait_ready, ReadyRequest(replica_id=REPLICA, port=replica.port))
        assert ready.ready, ready.detail
        assert vllm.adapters == {"sql": "/a/sql", "poem": "/a/poem"}
    spec = agent.supervisor.read_spec(REPLICA)
    assert spec is not None
    assert spec.pending_adapters is None
    assert spec.fingerprint == new.profile_fingerprint(0)
    publisher = spec.publisher()
    assert publisher is not None
    assert dict(publisher.adapters) == {"sql": "/a/sql", "poem": "/a/poem"}


async def test_adapters_an_engine_refuses_once_ready_leave_it_not_ready(
    agent: NodeAgentActivities, weights: Path
) -> None:
    replica = Replica(weights)
    env = ActivityEnvironment()
    await env.run(agent.start_engine, replica.launch(replica.model(SQL)))
    big = LoraAdapter(name="big", path="/a/rank64")
    await env.run(agent.start_engine, replica.launch(replica.model(big)))
    async with serving(replica.port, {"sql": "/a/sql"}):
        ready = await env.run(agent.wait_ready, ReadyRequest(replica_id=REPLICA, port=replica.port))
    assert not ready.ready
    assert "adapters not loaded: loading adapter big" in ready.detail


async def test_adapters_an_engine_refuses_at_once_restart_it_with_them(
    tmp_path: Path, weights: Path
) -> None:
    replica = Replica(weights)
    # The stand-in serving on the engine's port is not the stranger the port check looks for.
    agent = make_agent(tmp_path, own_ports={replica.port})
    env = ActivityEnvironment()
    try:
        first = await env.run(agent.start_engine, replica.launch(replica.model(SQL)))
        big = replica.model(LoraAdapter(name="big", path="/a/rank64"))
        async with serving(replica.port, {"sql": "/a/sql"}):
            second = await env.run(agent.start_engine, replica.launch(big))
        assert not second.adopted
        assert second.pid != first.pid
        spec = agent.supervisor.read_spec(REPLICA)
        assert spec is not None
        assert spec.fingerprint == big.profile_fingerprint(0)
        assert spec.pending_adapters is None
    finally:
        agent.stop_all_engines()


def test_a_spec_from_before_restart_fingerprints_adopts_on_an_equal_fingerprint(
    tmp_path: Path,
) -> None:
    supervisor = ShardSupervisor(tmp_path / "shards", tmp_path / "logs")
    port = free_port()
    first = supervisor.launch(REPLICA, "wf", ["sleep", "300"], {}, "f", port)
    try:
        spec = supervisor.read_spec(REPLICA)
        assert spec is not None
        old = {
            k: v
            for k, v in asdict(spec).items()
            if k not in ("restart_fingerprint", "pending_adapters", "pending_fingerprint")
        }
        # As an agent before this change wrote it.
        (tmp_path / "shards" / f"{REPLICA}.json").write_text(json.dumps(old))
        again = supervisor.launch(
            REPLICA, "wf", ["sleep", "300"], {}, "f", port, restart_fingerprint="r"
        )
        assert (again.adopted, again.pid) == (True, first.pid)
        # Its restart fingerprint is unknown: another full fingerprint restarts it.
        other = supervisor.launch(
            REPLICA, "wf", ["sleep", "300"], {}, "g", port, restart_fingerprint="r"
        )
        assert not other.adopted
        assert other.pid != first.pid
    finally:
        supervisor.stop_all(2.0)
