"""End to end, models as artifacts on the real llama-server, used through the `openai` client:
SmolLM2 imported from an Ollama store (laid out here from the real GGUF) by `llmgw model
import-ollama`, whose stop words reach llama-server as its default stop strings (a request
without its own `stop` is cut at one, a request with its own `stop` is not); and SmolLM2 added
`--from` an HTTP URL served by the test: mirrored, fetched by the node, checked and served.

The first run on a machine builds llama-server from source (cached afterwards in
~/.cache/llmgw or $LLMGW_CACHE_DIR); the fixture allows for that."""

import hashlib
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.e2e.test_smollm2 import FIRST_BUILD_ALLOWANCE_S
from tests.ollama_kit import MODEL, import_and_check, ollama_store
from tests.system import System, wait_ready
from tests.unit.mirror_server import FileServer, serving
from workers.demo import demo_weights

pytestmark = pytest.mark.e2e

# "Paris" as a stop word: the answer to the question below is cut before it.
STOP = "Paris"
PARAMS = {"stop": ["<|im_start|>", "<|im_end|>", STOP], "temperature": 0.0, "num_ctx": 2048}
QUESTION = "What is the capital of France? Answer in one sentence."
FROM_URL = "smol-from-url"


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    system = System(tmp_path_factory.mktemp("state"), demo=False, engine_path=None)
    system.start(timeout=FIRST_BUILD_ALLOWANCE_S)
    yield system
    if system.process is not None and system.process.poll() is None:
        assert system.stop() == 0


async def test_an_imported_ollama_model_serves_with_its_stop_words(
    system: System, tmp_path: Path
) -> None:
    store = tmp_path / "ollama"
    digest = ollama_store(store, demo_weights(), PARAMS)
    weights = await import_and_check(system, store, digest, PARAMS)

    client = openai.OpenAI(base_url=system.base_url, api_key=system.api_key, max_retries=0)

    def ask(stop: list[str] | openai.Omit = openai.omit) -> str:
        # Omitted, `stop` is not in the request at all: llama-server's defaults apply.
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": QUESTION}],
            max_tokens=32,
            stop=stop,
        )
        assert reply.model == MODEL
        assert reply.usage is not None
        assert reply.usage.completion_tokens > 0
        return reply.choices[0].message.content or ""

    # The request's own stop replaces the defaults (llama-server's rule), so the answer names
    # the city; without one, Ollama's stop word cuts it there.
    assert STOP in ask(stop=["zzz"])
    cut = ask()
    assert cut.strip()
    assert STOP not in cut

    system.cli("model", "rm", MODEL)
    await system.until(lambda: system.released(MODEL), 60, "the model to release its allocation")
    assert system.engine_processes(str(weights)) == []


async def test_a_model_added_from_a_url_is_fetched_checked_and_served(system: System) -> None:
    weights = demo_weights().read_bytes()
    digest = hashlib.sha256(weights).hexdigest()
    with serving(FileServer(files={"/models/smol.gguf": weights})) as server:
        url = f"{server.url}/models/smol.gguf#sha256={digest}"
        added = system.cli("model", "add", FROM_URL, "--from", url, "--memory-mb", "1024")
    assert f"sha256:{digest}" in added.stdout
    # The CLI reports the download's progress as it goes.
    assert "100%" in added.stderr, added.stderr

    await wait_ready(system, FROM_URL, 1, timeout=180)
    (fetched,) = (system.state_dir / "artifacts").glob("*/smol.gguf")
    assert hashlib.sha256(fetched.read_bytes()).hexdigest() == digest
    assert system.engine_processes(str(fetched)), "llama-server runs the node's fetched copy"

    client = openai.OpenAI(base_url=system.base_url, api_key=system.api_key, max_retries=0)
    reply = client.chat.completions.create(
        model=FROM_URL,
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=16,
        temperature=0.0,
    )
    assert reply.usage is not None
    assert reply.usage.completion_tokens > 0
    assert (reply.choices[0].message.content or "").strip()
    system.cli("model", "rm", FROM_URL)
    await system.until(lambda: system.released(FROM_URL), 60, "the model to release it")
