"""`llmgw mirror add ollama://NAME[:TAG]`: a model Ollama has pulled, into the mirror. Ollama's
store is read as `model import-ollama` reads it (workers/ollama/store.py: names and digests
checked, links kept inside the store); each blob is hashed while it is copied and must match
its Ollama digest, which is also its mirror digest, so a blob the mirror already holds is not
copied again. The artifact holds `model.gguf`, then `adapter.gguf`, `adapter-2.gguf`, ... and
`projector.gguf`, ... when Ollama's manifest has such layers."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from activities.control.mirror.add import Added, FileProgress, default_name, record
from activities.control.mirror.errors import MirrorError
from activities.control.mirror.ingest import Stored, ingest_stream
from activities.control.mirror.sources import OllamaSource
from activities.control.mirror.store import MirrorStore, check_ref_name
from workers.ollama.model_import import default_model_name
from workers.ollama.store import (
    Blob,
    OllamaStore,
    OllamaStoreError,
    default_store,
    parse_reference,
)


def numbered(kind: str, blobs: list[Blob]) -> list[tuple[str, Blob]]:
    return [(f"{kind}.gguf" if i == 0 else f"{kind}-{i + 1}.gguf", b) for i, b in enumerate(blobs)]


def add_ollama(
    store: MirrorStore,
    source: OllamaSource,
    ollama_dir: str | None,
    name: str | None,
    progress: FileProgress | None = None,
) -> Added:
    if name is not None:
        check_ref_name(name)
    try:
        ollama = OllamaStore(Path(ollama_dir) if ollama_dir else default_store())
        ref = parse_reference(source.reference)
        found = ollama.load(ref)
    except OllamaStoreError as err:
        raise MirrorError(f"ollama://{source.reference}: {err}") from None
    items = [
        ("model.gguf", found.model),
        *numbered("adapter", found.adapters),
        *numbered("projector", found.projectors),
    ]
    with store.adding():
        stored: dict[str, Stored] = {}
        for path, blob in items:
            digest = str(blob)
            if store.has_blob(digest):
                stored[path] = Stored(digest, blob.size, new=False)
                continue
            try:
                fd, _ = ollama.open_blob(blob)
            except OllamaStoreError as err:
                raise MirrorError(f"ollama://{source.reference}: {err}") from None
            with os.fdopen(fd, "rb") as f:
                each = None if progress is None else _bind(progress, path)
                stored[path] = ingest_stream(
                    store, f, f"{path} ({digest})", blob.size, expected=digest, progress=each
                )
        chosen = name or default_name(default_model_name(ref))
        return record(store, chosen, f"ollama:{ref.short}", stored)


def _bind(progress: FileProgress, what: str) -> Callable[[int, int | None], None]:
    return lambda done, total: progress(what, done, total)
