"""The node agent's activities through Temporal's ActivityEnvironment, with the stand-in engine
as the operator-configured llama-server."""

import asyncio
import os
import shutil
import signal
import socket
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from aiohttp import web
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.agent import procfs
from activities.agent.engine_launch import EngineLauncher
from activities.agent.node_agent import AgentConfig, NodeAgentActivities
from activities.agent.supervisor import ShardSpec, ShardSupervisor
from engines.adapter import KvPublisher
from tests.ports import free_port
from workers import paths
from workers.agent import AgentOptions, metrics_url, start_metrics
from workflows.artifact_names import COMPLETE_MARKER
from workflows.contracts import (
    Allocation,
    DiscoverRequest,
    EngineInstallRequest,
    EngineLoadRequest,
    EngineRequirement,
    EngineState,
    KvSource,
    LaunchRequest,
    LoraAdapter,
    ModelSpec,
    Profile,
    ReadyRequest,
    ShardAllocation,
    ShardRef,
)
from workflows.engine_keys import engine_key
from workflows.placement.ports import KV_PUB, KV_REPLAY

STANDIN = Path(__file__).resolve().parent.parent / "standin_llama_server"
SECRET = b"node-secret-for-tests-0123456789"


@pytest.fixture(autouse=True)
def venv_python_first(monkeypatch: pytest.MonkeyPatch) -> None:
    # The stand-in wrapper runs `python3` from PATH (the only variable, with HOME and LANG, an
    # engine inherits): make that this interpreter, which has aiohttp.
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")


def make_config(tmp_path: Path, with_engine: bool = True) -> AgentConfig:
    return AgentConfig(
        node="node-a",
        address="127.0.0.1",
        state_dir=tmp_path / "state",
        cache_dir=tmp_path / "cache",
        node_secret=SECRET,
        engine_paths={"llamacpp": str(STANDIN)} if with_engine else {},
        supervise_poll_s=0.1,
        ready_poll_s=0.1,
        stop_grace_s=2.0,
    )


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[NodeAgentActivities]:
    acts = NodeAgentActivities(make_config(tmp_path))
    yield acts
    acts.stop_all_engines()


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    path = tmp_path / "smollm2.gguf"
    path.write_bytes(b"GGUF")
    return path


def launch_request(weights: Path, port: int, replica: str = "smollm2-0") -> LaunchRequest:
    return LaunchRequest(
        replica_id=replica,
        workflow_id=f"replica:smollm2:{replica[-1]}",
        model=ModelSpec(name="smollm2", weights=str(weights), cpu_cores=2),
        allocation=Allocation(
            replica_id=replica,
            node="node-a",
            address="127.0.0.1",
            port=port,
            cpu_cores=2,
            memory_mb=1024,
        ),
    )


def recording_env() -> tuple[ActivityEnvironment, list[tuple[object, ...]]]:
    env = ActivityEnvironment()
    beats: list[tuple[object, ...]] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    return env, beats


async def test_discover_reports_this_node(agent: NodeAgentActivities) -> None:
    inventory = await ActivityEnvironment().run(agent.discover, DiscoverRequest(node="node-a"))
    assert inventory.name == "node-a"
    assert inventory.cpu_cores > 0
    with pytest.raises(ApplicationError, match="reached agent node-a") as raised:
        await ActivityEnvironment().run(agent.discover, DiscoverRequest(node="node-b"))
    assert raised.value.non_retryable


async def test_discovery_reports_the_artifacts_held_whole_and_the_room_for_more(
    agent: NodeAgentActivities, tmp_path: Path
) -> None:
    root = tmp_path / "state" / "artifacts"
    whole, partial = "ab" * 32, "cd" * 32
    for hex_digest in (whole, partial):
        (root / hex_digest).mkdir(parents=True)
    (root / whole / COMPLETE_MARKER).write_text("")
    (root / "blobs").mkdir()  # the store's own folders are not artifacts
    inventory = await ActivityEnvironment().run(agent.discover, DiscoverRequest(node="node-a"))
    assert inventory.artifacts == [f"sha256:{whole[:16]}"]
    free = inventory.artifact_disk_free_mb
    assert free is not None
    assert 0 < free <= shutil.disk_usage(root).total // 1_000_000


async def test_unknown_engine_is_a_failed_status_not_an_error(
    agent: NodeAgentActivities,
) -> None:
    req = EngineInstallRequest(
        node="node-a", requirement=EngineRequirement(engine="mystery", version="0.10.0")
    )
    status = await ActivityEnvironment().run(agent.install_engine, req)
    assert status.state is EngineState.FAILED
    assert status.detail == "engine mystery is not supported on this node"


async def test_an_external_engine_is_neither_installed_nor_launched_here(
    agent: NodeAgentActivities, weights: Path
) -> None:
    req = EngineInstallRequest(
        node="node-a", requirement=EngineRequirement(engine="external", version="")
    )
    status = await ActivityEnvironment().run(agent.install_engine, req)
    assert status.state is EngineState.FAILED
    assert "served outside llmgw" in status.detail

    launch = launch_request(weights, free_port())
    external = ModelSpec(
        name="smollm2",
        weights=str(weights),
        profiles=[Profile(engine="external", urls=["http://10.9.9.9:8000/v1"])],
    )
    with pytest.raises(ApplicationError, match="engine external is not supported") as raised:
        await ActivityEnvironment().run(
            agent.start_engine, launch.model_copy(update={"model": external})
        )
    assert raised.value.type == "EngineNotSupported"
    assert raised.value.non_retryable
    assert agent.supervisor.shards() == []


async def test_configured_engine_path_is_verified_with_heartbeats(
    agent: NodeAgentActivities,
) -> None:
    env, beats = recording_env()
    req = EngineInstallRequest(
        node="node-a", requirement=EngineRequirement(engine="llamacpp", version="11434.0.0")
    )
    status = await env.run(agent.install_engine, req)
    assert status.state is EngineState.INSTALLED, status.detail
    assert status.path == str(STANDIN)
    assert status.detail.startswith("version: 1 (standin)")
    assert beats, "the UI must see progress while installing"


async def test_start_ready_kill_supervise(agent: NodeAgentActivities, weights: Path) -> None:
    port = free_port()
    env, beats = recording_env()
    launched = await env.run(agent.start_engine, launch_request(weights, port))
    assert not launched.adopted
    assert launched.command[:5] == [str(STANDIN), "--host", "127.0.0.1", "--port", str(port)]

    ready = await env.run(agent.wait_ready, ReadyRequest(replica_id="smollm2-0", port=port))
    assert ready.ready, ready.detail

    # The engine accepts the derived key, which never appears on its command line.
    key = engine_key(SECRET, "smollm2-0")
    async with httpx.AsyncClient() as client:
        ok = await client.get(
            f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {key}"}
        )
        denied = await client.get(f"http://127.0.0.1:{port}/v1/models")
    assert ok.status_code == 200
    assert denied.status_code == 401
    assert key.encode() not in Path(f"/proc/{launched.pid}/cmdline").read_bytes()

    supervise = asyncio.create_task(
        env.run(agent.supervise_engine, ShardRef(replica_id="smollm2-0"))
    )
    await asyncio.sleep(0.3)
    assert not supervise.done()
    beats.clear()
    os.kill(launched.pid, signal.SIGKILL)
    ended = await asyncio.wait_for(supervise, 10)
    assert ended.replica_id == "smollm2-0"
    assert ended.exit_code == -signal.SIGKILL
    assert "killed by SIGKILL" in ended.reason
    # The engine's output stays on the node, in its log; the exit says how it ended.
    assert "listening" not in ended.model_dump_json()
    assert "listening" in agent.supervisor.log_tail("smollm2-0")


async def test_start_twice_adopts_one_process_then_stop(
    agent: NodeAgentActivities, weights: Path
) -> None:
    port = free_port()
    env = ActivityEnvironment()
    first = await env.run(agent.start_engine, launch_request(weights, port))
    second = await env.run(agent.start_engine, launch_request(weights, port))
    assert second.adopted
    assert second.pid == first.pid
    assert [s.pid for s in agent.supervisor.shards()] == [first.pid]

    stopped = await env.run(agent.stop_engine, ShardRef(replica_id="smollm2-0"))
    assert stopped.was_running
    stat = procfs.read_stat(first.pid)
    assert stat is None or not stat.running
    again = await env.run(agent.stop_engine, ShardRef(replica_id="smollm2-0"))
    assert not again.was_running


async def test_restarted_agent_adopts_and_cancelled_watch_leaves_engine_running(
    tmp_path: Path, weights: Path
) -> None:
    port = free_port()
    before = NodeAgentActivities(make_config(tmp_path))
    first = await ActivityEnvironment().run(before.start_engine, launch_request(weights, port))
    after = NodeAgentActivities(make_config(tmp_path))  # the agent process restarted
    try:
        adopted = await ActivityEnvironment().run(after.start_engine, launch_request(weights, port))
        assert adopted.adopted
        assert adopted.pid == first.pid

        env = ActivityEnvironment()
        watch = asyncio.create_task(
            env.run(after.supervise_engine, ShardRef(replica_id="smollm2-0"))
        )
        await asyncio.sleep(0.3)
        env.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watch
        assert after.supervisor.is_alive("smollm2-0")
    finally:
        after.stop_all_engines()
        before.stop_all_engines()


async def test_engine_dead_while_agent_was_down_is_reported_at_boot(
    tmp_path: Path, weights: Path
) -> None:
    port = free_port()
    before = NodeAgentActivities(make_config(tmp_path))
    launched = await ActivityEnvironment().run(before.start_engine, launch_request(weights, port))
    os.kill(launched.pid, signal.SIGKILL)
    # Reaped (as init would reap a gone agent's orphan) once the kill has landed.
    for _ in range(200):
        if not before.supervisor.is_alive("smollm2-0"):
            break
        await asyncio.sleep(0.05)
    after = NodeAgentActivities(make_config(tmp_path))
    (dead,) = after.dead_shards()
    assert dead.workflow_id == "replica:smollm2:0"
    assert dead.exit.replica_id == "smollm2-0"
    assert "while the agent was not running" in dead.exit.reason
    assert after.stop_all_engines()[0].was_running is False


async def test_missing_engine_or_weights_fail_without_retry(tmp_path: Path, weights: Path) -> None:
    bare = NodeAgentActivities(make_config(tmp_path, with_engine=False))
    with pytest.raises(ApplicationError, match="not installed on node node-a") as raised:
        await ActivityEnvironment().run(bare.start_engine, launch_request(weights, free_port()))
    assert raised.value.non_retryable

    agent = NodeAgentActivities(make_config(tmp_path))
    with pytest.raises(ApplicationError, match="not found on node node-a") as raised:
        await ActivityEnvironment().run(
            agent.start_engine, launch_request(tmp_path / "absent.gguf", free_port())
        )
    assert raised.value.non_retryable
    assert agent.supervisor.shards() == []


async def test_an_artifacts_weights_start_only_once_fetched_completely(
    agent: NodeAgentActivities, tmp_path: Path
) -> None:
    """A model whose weights are a mirror artifact runs the file inside the artifact's
    directory on this node, and only once its fetch wrote the completion marker."""
    artifact = "sha256:" + "cd" * 32
    directory = tmp_path / "state" / "artifacts" / ("cd" * 32)
    directory.mkdir(parents=True)
    (directory / "model.gguf").write_bytes(b"GGUF")
    request = launch_request(tmp_path / "unused.gguf", free_port())
    request.model = request.model.model_copy(update={"artifact": artifact, "weights": "model.gguf"})
    env = ActivityEnvironment()
    with pytest.raises(ApplicationError, match=f"artifact {artifact} .* not fetched") as raised:
        await env.run(agent.start_engine, request)
    assert raised.value.type == "WeightsMissing"
    assert raised.value.non_retryable

    (directory / COMPLETE_MARKER).write_text("")
    launched = await env.run(agent.start_engine, request)
    assert str(directory / "model.gguf") in launched.command
    await env.run(agent.stop_engine, ShardRef(replica_id=request.replica_id))

    # An adapter from the mirror runs from its artifact too, once that is fetched.
    adapter_artifact = "sha256:" + "ef" * 32
    profile = request.model.profiles[0].model_copy(
        update={"lora": [LoraAdapter(name="sql", path="sql.gguf", artifact=adapter_artifact)]}
    )
    request.model = request.model.model_copy(update={"profiles": [profile]})
    with pytest.raises(ApplicationError, match="adapter sql of model smollm2 is not fetched"):
        await env.run(agent.start_engine, request)
    adapter_dir = tmp_path / "state" / "artifacts" / ("ef" * 32)
    adapter_dir.mkdir()
    (adapter_dir / "sql.gguf").write_bytes(b"GGUF")
    (adapter_dir / COMPLETE_MARKER).write_text("")
    launched = await env.run(agent.start_engine, request)
    assert str(adapter_dir / "sql.gguf") in launched.command


async def test_a_port_held_by_a_stranger_fails_the_start_clearly(
    agent: NodeAgentActivities, weights: Path
) -> None:
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        port = stranger.getsockname()[1]
        with pytest.raises(ApplicationError, match=f"port {port} .* in use") as raised:
            await ActivityEnvironment().run(agent.start_engine, launch_request(weights, port))
    assert raised.value.non_retryable
    assert raised.value.type == "PortInUse"
    assert agent.supervisor.shards() == []


async def environ(pid: int) -> dict[str, str]:
    """The environment a running process was started with.

    The stand-in is a shell wrapper that execs Python: in the middle of that second exec,
    /proc/PID/environ reads empty for a moment, so an empty read is retried, not believed.
    """
    for _ in range(100):
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        env = dict(item.decode().split("=", 1) for item in raw if b"=" in item)
        if env:
            return env
        stat = procfs.read_stat(pid)
        exited = f"engine {pid} exited before its environment was read"
        assert stat is not None, exited
        assert stat.running, exited
        await asyncio.sleep(0.05)
    raise AssertionError(f"/proc/{pid}/environ stayed empty for 5 s")


async def test_launch_uses_the_placed_profile_and_this_nodes_shard(
    agent: NodeAgentActivities, weights: Path
) -> None:
    port = free_port()
    req = launch_request(weights, port)
    model = ModelSpec(
        name="smollm2",
        weights=str(weights),
        profiles=[
            Profile(engine="vllm", gpu_class="h100-80g", gpus_per_node=1),
            Profile(
                cpu_cores=2,
                parallel=3,
                env={"NCCL_DEBUG": "INFO", "LD_PRELOAD": "/tmp/evil.so", "PATH": "/tmp"},
            ),
        ],
    )
    alloc = req.allocation.model_copy(
        update={
            "profile_index": 1,
            "shards": [ShardAllocation(node="node-a", address="127.0.0.1", port=port, cpu_cores=2)],
        }
    )
    launched = await ActivityEnvironment().run(
        agent.start_engine, req.model_copy(update={"model": model, "allocation": alloc})
    )
    assert launched.command[launched.command.index("-np") + 1] == "3"  # profile 1's
    spec = agent.supervisor.read_spec("smollm2-0")
    assert spec is not None
    assert spec.fingerprint == model.profile_fingerprint(1)
    assert spec.gpu_uuids == []
    env = await environ(launched.pid)
    assert env["NCCL_DEBUG"] == "INFO"
    assert "LD_PRELOAD" not in env
    assert env["PATH"] == os.environ["PATH"]  # the agent's, not the profile's
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # a CPU shard sees no GPU
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


async def test_a_replica_without_a_shard_here_is_refused(
    agent: NodeAgentActivities, weights: Path
) -> None:
    req = launch_request(weights, free_port())
    elsewhere = req.allocation.model_copy(
        update={"shards": [ShardAllocation(node="node-b", address="10.0.0.2", port=18001)]}
    )
    with pytest.raises(ApplicationError, match="no shard on node node-a") as raised:
        await ActivityEnvironment().run(
            agent.start_engine, req.model_copy(update={"allocation": elsewhere})
        )
    assert raised.value.type == "WrongNode"
    assert agent.supervisor.shards() == []


def test_a_machine_named_like_external_models_routes_still_gets_a_node_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The socket module workers.paths calls gethostname() through.
    monkeypatch.setattr(socket, "gethostname", lambda: "External")
    assert paths.default_node_name() == "external-node"
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu-07.lab")
    assert paths.default_node_name() == "gpu-07-lab"


@pytest.mark.parametrize(
    ("engine", "seen"),
    [("trtllm", True), ("", False)],  # "": a spec written before the engine was recorded
)
async def test_an_engines_load_is_read_from_its_own_metrics_path(
    agent: NodeAgentActivities, engine: str, seen: bool
) -> None:
    # trtllm-serve serves its metrics at /prometheus/metrics, not /metrics: read from the
    # wrong path its load was unseen and a drain of it stopped at once.
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="trtllm_num_requests_running 2\ntrtllm_num_requests_waiting 1\n")

    app = web.Application()
    app.router.add_get("/prometheus/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        spec = ShardSpec(
            replica_id="m-0",
            workflow_id="replica:m:0",
            pid=os.getpid(),
            start_time=0,
            command=["trtllm-serve"],
            fingerprint="f",
            port=port,
            log_path="",
            engine=engine,
        )
        agent._supervisor._write_spec(spec)
        report = await ActivityEnvironment().run(
            agent.engine_load, EngineLoadRequest(replica_ids=["m-0"])
        )
    finally:
        await runner.cleanup()
    [load] = report.engines
    assert load.seen is seen
    assert (load.running, load.waiting) == ((2, 1) if seen else (0, 0))


def kv_events_request(weights: Path, port: int, kv_pub: int, kv_replay: int) -> LaunchRequest:
    """A vLLM replica that publishes KV-cache events, on the ports placement handed out."""
    req = launch_request(weights, port)
    model = ModelSpec(
        name="smollm2",
        weights=str(weights),
        profiles=[Profile(engine="vllm", engine_version="0.11.0", kv_events=True, cpu_cores=2)],
    )
    shard = ShardAllocation(
        node="node-a",
        address="127.0.0.1",
        port=port,
        cpu_cores=2,
        extra_ports={KV_PUB: kv_pub, KV_REPLAY: kv_replay},
    )
    allocation = req.allocation.model_copy(update={"shards": [shard]})
    return req.model_copy(update={"model": model, "allocation": allocation})


async def test_a_publishing_engine_is_reported_with_this_agents_kv_feed(
    tmp_path: Path, weights: Path
) -> None:
    fake_vllm = tmp_path / "vllm"  # stands in for `vllm serve`: only its process matters here
    fake_vllm.write_text("#!/bin/sh\nexec sleep 300\n")
    fake_vllm.chmod(0o755)
    feed_port, port, kv_pub, kv_replay = free_port(), free_port(), free_port(), free_port()
    config = replace(
        make_config(tmp_path),
        engine_paths={"vllm": str(fake_vllm)},
        nvidia=False,
        kv_feed_port=feed_port,
    )
    launches: list[str] = []
    # The agent's own subscriber may still hold the publisher's port from the engine's last
    # run: the engine connects to it, so that does not refuse the launch (a stranger's does:
    # test_engine_ports.py).
    agent = NodeAgentActivities(
        config, on_launch=lambda: launches.append("launched"), own_ports=lambda: {kv_pub}
    )
    req = kv_events_request(weights, port, kv_pub, kv_replay)
    subscriber = socket.socket()
    subscriber.bind(("127.0.0.1", kv_pub))
    subscriber.listen()
    try:
        launched = await ActivityEnvironment().run(agent.start_engine, req)
        assert launched.kv == KvSource(
            feed=f"http://127.0.0.1:{feed_port}", block_size=32, hash_seed="0"
        )
        assert launches == ["launched"]  # the subscriptions look again at once
        spec = agent.supervisor.read_spec("smollm2-0")
        assert spec is not None
        assert spec.publisher() == KvPublisher(
            f"tcp://127.0.0.1:{kv_pub}", f"tcp://127.0.0.1:{kv_replay}", "smollm2-0", 32, "0"
        )

        config.kv_feed_port = 0  # no feed: gateways route by their own index
        adopted = await ActivityEnvironment().run(agent.start_engine, req)
        assert adopted.adopted
        assert adopted.kv is None
    finally:
        subscriber.close()
        agent.stop_all_engines()


def test_a_kv_feed_on_an_ipv6_address_is_named_in_brackets(tmp_path: Path) -> None:
    config = replace(make_config(tmp_path), address="fd00::1", kv_feed_port=8003)
    publisher = KvPublisher("tcp://127.0.0.1:1", "tcp://127.0.0.1:2", "m-0", 16, None)
    supervisor = ShardSupervisor(tmp_path / "shards", tmp_path / "logs")
    launcher = EngineLauncher(config, supervisor, lambda: pytest.fail("no inventory needed"))
    source = launcher.kv_source(publisher)
    assert source == KvSource(feed="http://[fd00::1]:8003", block_size=16, hash_seed=None)
    assert launcher.kv_source(None) is None


async def test_the_agents_metrics_url_is_in_its_inventory(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    agent = NodeAgentActivities(config)
    assert await start_metrics(AgentOptions(node="node-a"), config, agent) is None
    service = await start_metrics(
        AgentOptions(node="node-a", metrics_port=free_port()), config, agent
    )
    assert service is not None
    try:
        inventory = await ActivityEnvironment().run(agent.discover, DiscoverRequest(node="node-a"))
        assert inventory.metrics_url == f"http://127.0.0.1:{service.port}/metrics"
        await service.read_once()
        async with httpx.AsyncClient() as client:
            page = (await client.get(inventory.metrics_url)).text
        assert 'llmgw_node_info{node="node-a"' in page
    finally:
        await service.stop()


def test_a_wildcard_metrics_listener_is_reached_at_the_nodes_address() -> None:
    assert metrics_url("127.0.0.1", 8005, "10.0.0.7") == "http://127.0.0.1:8005/metrics"
    assert metrics_url("0.0.0.0", 8005, "10.0.0.7") == "http://10.0.0.7:8005/metrics"
    assert metrics_url("::", 8005, "fd00::7") == "http://[fd00::7]:8005/metrics"
    assert metrics_url("10.0.0.9", 8005, "10.0.0.7") == "http://10.0.0.9:8005/metrics"


async def test_an_engine_dying_while_loading_is_explained_by_its_root_cause(
    tmp_path: Path, weights: Path
) -> None:
    """The replica's status says why: the first exception the engine logged, not the last
    ("see root cause above")."""
    failing = tmp_path / "failing-llama-server"
    failing.write_text(
        '#!/bin/sh\nSTANDIN_FAIL_LOAD="not enough KV cache memory for 2048 tokens"'
        f' exec {STANDIN} "$@"\n'
    )
    failing.chmod(0o755)
    config = replace(make_config(tmp_path), engine_paths={"llamacpp": str(failing)})
    agent = NodeAgentActivities(config)
    port = free_port()
    env, _beats = recording_env()
    try:
        await env.run(agent.start_engine, launch_request(weights, port))
        ready = await env.run(agent.wait_ready, ReadyRequest(replica_id="smollm2-0", port=port))
    finally:
        agent.stop_all_engines()
    assert not ready.ready
    assert ready.detail.startswith("engine process exited while loading")
    assert ready.detail.endswith(": RuntimeError: not enough KV cache memory for 2048 tokens")


async def test_an_agent_on_an_ipv6_address_sees_its_engine_ready_and_reads_its_load(
    tmp_path: Path, weights: Path
) -> None:
    # The port check bound an IPv4 socket to an IPv6 address (every port read "in use"), and
    # unbracketed, http://::1:PORT names no port: readiness never saw the engine, and reading its
    # load (for routing, metrics and drains) failed the activity.
    agent = NodeAgentActivities(replace(make_config(tmp_path), address="::1"))
    port = free_port()
    req = launch_request(weights, port)
    req = req.model_copy(
        update={"allocation": req.allocation.model_copy(update={"address": "::1"})}
    )
    try:
        launched = await ActivityEnvironment().run(agent.start_engine, req)
        assert launched.command[1:3] == ["--host", "::1"]
        ready = await ActivityEnvironment().run(
            agent.wait_ready, ReadyRequest(replica_id="smollm2-0", port=port)
        )
        assert ready.ready, ready.detail
        report = await ActivityEnvironment().run(
            agent.engine_load, EngineLoadRequest(replica_ids=["smollm2-0"])
        )
        [load] = report.engines
        assert load.seen
    finally:
        agent.stop_all_engines()
