"""`llmgw model add NAME --from URL` against a running llmgw: the weights, served over HTTP by
the test, go into the control plane's mirror (verified against the digest the URL names), the
replica's node fetches them from `llmgw mirror serve`, and the engine the agent starts runs the
fetched file, with a LoRA adapter added --lora-from the same way; requests through the gateway
are answered. With the stand-in engine (it opens the
weights file it is given): tests/e2e does the same with the real llama-server."""

import hashlib

import openai
import pytest

from tests.system import System, wait_ready
from tests.unit.mirror_server import FileServer, serving
from workers.demo import demo_weights
from workflows.artifact_names import artifact_hint
from workflows.model.client import list_models

pytestmark = [pytest.mark.integration, pytest.mark.long]

MODEL = "from-url"


async def test_a_model_added_from_a_url_is_fetched_by_its_node_and_serves(
    system: System,
) -> None:
    weights = demo_weights().read_bytes()
    digest = hashlib.sha256(weights).hexdigest()
    adapter = b"GGUF a stand-in LoRA adapter"
    files = {"/smol/model.gguf": weights, "/smol/sql-lora.gguf": adapter}
    with serving(FileServer(files=files)) as server:
        url = f"{server.url}/smol/model.gguf#sha256={digest}"
        added = system.cli(
            "model", "add", MODEL, "--from", url, "--memory-mb", "1024",
            "--lora-from", f"sql={server.url}/smol/sql-lora.gguf",
        )  # fmt: skip
    # The digest named in the URL was checked, and the mirror reported what it took.
    assert f"sha256:{digest}" in added.stdout
    assert "model.gguf" in added.stdout
    listed = system.cli("mirror", "ls")
    assert MODEL in listed.stdout

    (replica,) = await wait_ready(system, MODEL, 1, timeout=120)
    # The engine runs the node's fetched copy, not the URL or the mirror's own file.
    fetched = list((system.state_dir / "artifacts").glob("*/model.gguf"))
    assert len(fetched) == 1
    assert fetched[0].read_bytes() == weights
    assert system.engine_processes(str(fetched[0])), "the engine runs the fetched file"
    # The adapter came from the mirror with the weights, and the engine loads the node's copy.
    (lora,) = (system.state_dir / "artifacts").glob("*/sql-lora.gguf")
    assert lora.read_bytes() == adapter
    assert system.engine_processes(str(lora)), "the engine loads the fetched adapter"

    client = openai.OpenAI(base_url=system.base_url, api_key=system.api_key, max_retries=0)
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello from the mirror"}], max_tokens=8
    )
    assert reply.choices[0].message.content

    # The model knows its weights' size, and the node reports holding them (at its agent's next
    # look, each minute) and its free disk: what placement reads to prefer it and to pass over
    # nodes without room.
    (view,) = [v for v in await list_models(await system.client()) if v.spec.name == MODEL]
    assert view.spec.artifact_size == len(weights)

    async def holds_the_weights() -> bool:
        inventory = (await system.ledger()).nodes[system.node].inventory
        return artifact_hint(view.spec.artifact) in inventory.artifacts

    await system.until(holds_the_weights, 90, "the node to report the weights it fetched")
    assert (await system.ledger()).nodes[system.node].inventory.artifact_disk_free_mb
    shown = system.cli("node", "show", system.node).stdout
    assert "  artifacts 2 held, " in shown  # the weights and the adapter
    assert " free for more" in shown

    # Bytes that are not the ones the URL promises are refused, and nothing is defined.
    promised = hashlib.sha256(b"GGUF the promised bytes").hexdigest()
    with serving(FileServer(files={"/bad.gguf": b"GGUF not what was promised"})) as server:
        refused = system.cli(
            "model", "add", "wrong-digest", "--from", f"{server.url}/bad.gguf#sha256={promised}",
            "--memory-mb", "1024", check=False,
        )  # fmt: skip
    assert refused.returncode != 0
    assert promised in refused.stderr
    assert "wrong-digest" not in system.cli("model", "list").stdout

    system.cli("model", "rm", MODEL)
    await system.until(lambda: system.released(MODEL), 60, "the model to release its allocation")
    assert replica not in (await system.ledger()).routes
