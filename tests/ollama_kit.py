"""An Ollama store made in a test from the real SmolLM2 GGUF, and its import through a running
llmgw's CLI: shared by tests/integration/test_ollama_import.py (stand-in engine) and
tests/e2e/test_model_artifacts.py (the real llama-server)."""

import hashlib
import json
import shutil
from pathlib import Path

from tests.system import System, wait_ready
from workflows.model.client import describe_model

MODEL = "smollm2-135m"


def ollama_store(root: Path, gguf: Path, params: dict[str, object]) -> str:
    """An Ollama models directory holding `smollm2:135m` as `ollama pull` leaves it; returns
    the weights' sha256."""
    blobs = root / "blobs"
    blobs.mkdir(parents=True)

    def blob(
        media_type: str, data: bytes | None = None, source: Path | None = None
    ) -> dict[str, object]:
        digest = hashlib.sha256()
        if source is not None:
            with source.open("rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
            size = source.stat().st_size
        else:
            assert data is not None
            digest.update(data)
            size = len(data)
        path = blobs / f"sha256-{digest.hexdigest()}"
        if source is not None:
            shutil.copyfile(source, path)
        else:
            path.write_bytes(data or b"")
        return {"mediaType": media_type, "digest": f"sha256:{digest.hexdigest()}", "size": size}

    weights = blob("application/vnd.ollama.image.model", source=gguf)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": blob(
            "application/vnd.docker.container.image.v1+json", b'{"model_format":"gguf"}'
        ),
        "layers": [
            weights,
            blob(
                "application/vnd.ollama.image.template",
                b"{{ range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n"
                b"{{ end }}<|im_start|>assistant\n",
            ),
            blob("application/vnd.ollama.image.system", b"You are a helpful assistant."),
            blob("application/vnd.ollama.image.params", json.dumps(params).encode()),
            blob("application/vnd.ollama.image.license", b"Apache License 2.0"),
        ],
    }
    path = root / "manifests" / "registry.ollama.ai" / "library" / "smollm2" / "135m"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(manifest))
    return str(weights["digest"]).removeprefix("sha256:")


async def import_and_check(
    system: System, store: Path, digest: str, params: dict[str, object]
) -> Path:
    """Import through the CLI; the model is defined on the content-addressed copy and serves."""
    command = ("model", "import-ollama", "smollm2:135m", "--store", str(store), "--cpu-cores", "1")
    out = system.cli(*command)
    weights = system.state_dir / "models" / f"sha256-{digest}.gguf"
    assert "copied and verified" in out.stdout, out.stdout
    assert f"model {MODEL}: 1 replica(s) wanted" in out.stdout
    assert "system prompt is not used" in out.stderr
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == digest

    view = await describe_model(await system.client(), MODEL)
    assert view is not None
    assert view.spec.weights == str(weights)
    profile = view.spec.profiles[0]
    assert profile.engine == "llamacpp"
    assert profile.context_size == 2048
    stop = params.get("stop", [])
    assert isinstance(stop, list)
    for word in stop:
        assert profile.args[profile.args.index(word) - 1] == "--reverse-prompt"

    await wait_ready(system, MODEL, 1, timeout=180)
    assert system.engine_processes(str(weights)), "no engine serves the copied weights"

    # The same definition again: the copy is reused and nothing is rolled.
    again = system.cli(*command)
    assert "already there, verified" in again.stdout
    return weights
