"""Imports from Ollama started from the web console (workers/console_import.py): the CLI's
import-ollama steps on a real Ollama store and state dir, the model definition recorded
instead of reaching a model workflow. Bad input is refused before anything is copied."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from pathlib import Path

import pytest

from activities.control.mirror.store import MirrorStore
from gateway.console.source import ConsoleRefused
from tests.ollama_kit import ollama_store
from workers import console_import
from workers.console_import import OllamaImports
from workers.ollama.model_import import BlobProgress, ImportPlan, fetch_blobs
from workers.ollama.store import CHUNK, Blob
from workflows.contracts import ModelSpec

REFERENCE = "smollm2:135m"
MODEL = "smollm2-135m"


class Imports:
    def __init__(self, root: Path, defined: set[str] | None = None) -> None:
        gguf = root / "weights.gguf"
        # Several of the copy's chunks, so its progress has steps between 0 and the end.
        gguf.write_bytes(b"GGUF" + b"\x01" * (3 * CHUNK))
        self.digest = ollama_store(root / "ollama", gguf, {"num_ctx": 2048})
        self.size = gguf.stat().st_size
        self.root = root
        self.specs: list[ModelSpec] = []
        self.defined = set(defined or ())
        self.imports = OllamaImports(
            root / "models", root / "mirror", self.apply, self.names, str(root / "ollama")
        )

    async def apply(self, spec: ModelSpec) -> None:
        self.specs.append(spec)

    async def names(self) -> set[str]:
        return self.defined

    async def finished(self) -> None:
        for _ in range(500):
            if all(v.state in ("done", "failed") for v in self.imports.views()):
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"the import did not end: {self.imports.views()}")


async def test_an_import_copies_verifies_mirrors_and_defines_with_its_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kit = Imports(tmp_path)
    seen: list[tuple[str, int, int]] = []
    files: set[str] = set()
    real = fetch_blobs  # the one console_import calls, replaced below

    def watched(plan: ImportPlan, progress: BlobProgress) -> list[str]:
        def each(blob: Blob, done: int) -> None:
            progress(blob, done)
            (view,) = kit.imports.views()
            seen.append((view.state, view.done, view.total))
            files.add(view.file)

        return real(plan, each)

    monkeypatch.setattr(console_import, "fetch_blobs", watched)
    said = await kit.imports.start(REFERENCE, "", mirror=True)
    assert said == f"importing ollama {REFERENCE} as model {MODEL}"
    await kit.finished()
    # The copy's progress, as the page reads it: bytes of the whole import, rising, in steps.
    assert [s for s, _, _ in seen] == ["copying"] * len(seen)
    done = [d for _, d, _ in seen]
    assert done == sorted(done)
    assert len(done) >= 3
    assert done[-1] == kit.size
    assert all(total == kit.size for _, _, total in seen)
    assert files == {"model.gguf"}  # the file named by its part of the model
    (view,) = kit.imports.views()
    assert (view.state, view.done, view.total) == ("done", kit.size, kit.size)
    # Defined as import-ollama defines it, on the verified copy; and into the mirror.
    (spec,) = kit.specs
    weights = tmp_path / "models" / f"sha256-{kit.digest}.gguf"
    assert (spec.name, spec.weights) == (MODEL, str(weights))
    assert spec.profiles[0].engine == "llamacpp"
    assert spec.profiles[0].context_size == 2048
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == kit.digest
    assert MODEL in MirrorStore(tmp_path / "mirror").refs()


async def test_bad_input_is_refused_in_words_before_anything_is_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kit = Imports(tmp_path, defined={MODEL})
    cases = [
        ("nothere:1", "", 404, "no model nothere:1"),
        ("smollm2:9b", "", 404, "no tag '9b'"),
        ("../../etc/passwd", "", 400, "is not an Ollama model name"),
        (REFERENCE, "Bad Name!", 400, "invalid model: name"),
        (REFERENCE, "", 409, f"a model named {MODEL!r} is already defined"),
    ]
    for reference, name, status, words in cases:
        with pytest.raises(ConsoleRefused) as refused:
            await kit.imports.start(reference, name, mirror=True)
        assert refused.value.status == status, reference
        assert words in str(refused.value), str(refused.value)
    assert not (tmp_path / "models").exists()
    assert not (tmp_path / "mirror").exists()
    assert kit.imports.views() == []
    assert kit.specs == []
    # Under another name it goes ahead; a second import of it while it runs is refused.
    copying = threading.Event()
    release = threading.Event()
    real = fetch_blobs  # the one console_import calls, replaced below

    def held(plan: ImportPlan, progress: BlobProgress) -> list[str]:
        copying.set()
        release.wait(10)
        return real(plan, progress)

    monkeypatch.setattr(console_import, "fetch_blobs", held)
    await kit.imports.start(REFERENCE, "smol-copy", mirror=False)
    await asyncio.to_thread(copying.wait, 10)
    with pytest.raises(ConsoleRefused, match="being imported already"):
        await kit.imports.start(REFERENCE, "smol-copy", mirror=False)
    release.set()
    await kit.finished()
    assert [s.name for s in kit.specs] == ["smol-copy"]
    assert not (tmp_path / "mirror").exists()  # not asked for
