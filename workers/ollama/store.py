"""Reading a local Ollama model store: a name's manifest, its layers and their blobs. Pure: the
file system only, no server, nothing of llmgw's.

The store (`$OLLAMA_MODELS`, default ~/.ollama/models) holds `manifests/<host>/<namespace>/
<model>/<tag>` (JSON: a config and a list of layers, each a media type, a `sha256:<hex>` digest
and a size) and `blobs/sha256-<hex>`, one file per layer. Nothing read from it is trusted:

- names and tags take Ollama's characters only, never `..`, a path separator out of place or an
  absolute path, so a name cannot leave `manifests/`;
- a digest is `sha256:` and 64 hex digits, nothing else, so a layer cannot leave `blobs/`
  (CVE-2024-37032 was path traversal through a digest);
- a manifest or blob that is a link must stay inside the store once resolved, and must be a
  regular file (a FIFO would hang the reader);
- a manifest is at most MAX_MANIFEST_BYTES, a text layer at most MAX_TEXT_BYTES;
- every layer read is hashed as it is read, and refused, naming its digest, when the content
  does not match. The model's weights are large: they are hashed once, while they are copied
  (`copy_verified`), never read whole into memory.

Copying and verifying blobs is workers/ollama/blobs.py's, reading the weights' GGUF header
workers/ollama/gguf_header.py's; this module names, finds and opens what the store holds.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STORE_ENV = "OLLAMA_MODELS"
# Where the Linux install script's service keeps its models (for the message when ~ has none).
SERVICE_STORE = "/usr/share/ollama/.ollama/models"
DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"

MAX_MANIFEST_BYTES = 1 << 20
MAX_LAYERS = 256
# Templates, system prompts and parameters are a few KiB; anything much larger is not one.
MAX_TEXT_BYTES = 1 << 20
CHUNK = 1 << 20

MEDIA_PREFIX = "application/vnd.ollama.image."
MODEL = MEDIA_PREFIX + "model"
ADAPTER = MEDIA_PREFIX + "adapter"
PROJECTOR = MEDIA_PREFIX + "projector"
TEMPLATE = MEDIA_PREFIX + "template"
SYSTEM = MEDIA_PREFIX + "system"
PARAMS = MEDIA_PREFIX + "params"
LICENSE = MEDIA_PREFIX + "license"

DIGEST = re.compile(r"^sha256[:-]([0-9a-fA-F]{64})$")
# Ollama's own rules for each part of a name (server/internal/names): the first character a
# letter, digit or underscore; a host may hold a port; a namespace no dot.
_HOST = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,349}$")
_NAMESPACE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,79}$")
_MODEL = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}$")


class OllamaStoreError(ValueError):
    """A name, manifest or blob refused, with the reason in words."""


class NotInStore(OllamaStoreError):
    """The store has no such model or tag."""


def default_store() -> Path:
    env = os.environ.get(STORE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".ollama" / "models"


@dataclass(frozen=True)
class Reference:
    """`model`, `model:tag`, `namespace/model:tag` or `host/namespace/model:tag`."""

    host: str
    namespace: str
    model: str
    tag: str

    def __str__(self) -> str:
        return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"

    @property
    def short(self) -> str:
        """As `ollama list` shows it: the default host and namespace left out."""
        name = self.model
        if (self.host, self.namespace) != (DEFAULT_HOST, DEFAULT_NAMESPACE):
            name = f"{self.namespace}/{name}"
            if self.host != DEFAULT_HOST:
                name = f"{self.host}/{name}"
        return f"{name}:{self.tag}"


def parse_reference(text: str) -> Reference:
    """Ollama's name forms, the defaults filled in; refused with the reason otherwise."""
    if not text or len(text) > 600:
        raise OllamaStoreError(f"{text!r} is not an Ollama model name")
    if ".." in text or "\\" in text or text.startswith("/") or "://" in text:
        raise OllamaStoreError(
            f"{text!r} is not an Ollama model name: no '..', backslash, absolute path or URL"
        )
    if "@" in text:
        raise OllamaStoreError(f"{text!r}: name the model by name and tag, not by digest")
    name, tag = text, DEFAULT_TAG
    colon = text.rfind(":")
    if colon > text.rfind("/"):
        name, tag = text[:colon], text[colon + 1 :]
    parts = name.split("/")
    if len(parts) > 3:
        raise OllamaStoreError(
            f"{text!r} is not an Ollama model name: at most host/namespace/model:tag"
        )
    host, namespace = DEFAULT_HOST, DEFAULT_NAMESPACE
    if len(parts) == 3:
        host, namespace, model = parts
    elif len(parts) == 2:
        namespace, model = parts
    else:
        (model,) = parts
    for what, value, rule in (
        ("host", host, _HOST),
        ("namespace", namespace, _NAMESPACE),
        ("model", model, _MODEL),
        ("tag", tag, _TAG),
    ):
        if not rule.fullmatch(value):
            raise OllamaStoreError(f"{text!r}: {what} {value!r} is not a valid Ollama {what}")
    return Reference(host, namespace, model, tag)


def digest_hex(value: object) -> str:
    """The 64 lowercase hex digits of a `sha256:<hex>` (or `sha256-<hex>`) digest."""
    if not isinstance(value, str):
        raise OllamaStoreError(f"digest {value!r} is not a string")
    match = DIGEST.fullmatch(value)
    if match is None:
        raise OllamaStoreError(f"digest {value[:100]!r} is not sha256:<64 hex digits>")
    return match.group(1).lower()


@dataclass(frozen=True)
class Blob:
    """One layer's blob, found in the store and not yet hashed (workers/ollama/blobs.py)."""

    digest: str  # 64 lowercase hex digits
    size: int
    path: Path  # inside the store, links resolved

    @property
    def name(self) -> str:
        """How Ollama and llmgw name its file: sha256-<hex>."""
        return f"sha256-{self.digest}"

    def __str__(self) -> str:
        return f"sha256:{self.digest}"


@dataclass(frozen=True)
class OllamaModel:
    """What a manifest holds, its text layers read and verified."""

    reference: Reference
    manifest: Path
    model: Blob
    adapters: list[Blob] = field(default_factory=list)
    projectors: list[Blob] = field(default_factory=list)
    template: str | None = None
    system: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    # Layers not used: media type -> how many (licenses, messages, kinds llmgw does not know).
    unused: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Layer:
    media_type: str
    digest: str
    size: int


class OllamaStore:
    """One store directory, read as the module's docstring says."""

    def __init__(self, root: Path) -> None:
        try:
            self.root = root.expanduser().resolve(strict=True)
        except (OSError, RuntimeError):
            raise NotInStore(
                f"no Ollama store at {root} (give --store DIR or set ${STORE_ENV}; Ollama's "
                f"Linux service keeps its models in {SERVICE_STORE})"
            ) from None
        if not self.root.is_dir():
            raise OllamaStoreError(f"Ollama store {root} is not a directory")

    def manifest_path(self, ref: Reference) -> Path:
        return self.root / "manifests" / ref.host / ref.namespace / ref.model / ref.tag

    def blob_path(self, digest: str) -> Path:
        return self.root / "blobs" / f"sha256-{digest}"

    # --- opening files --------------------------------------------------------------------

    def open_regular(self, path: Path, what: str) -> tuple[int, int]:
        """(fd, size) of a regular file that is, links resolved, inside the store."""
        try:
            real = path.resolve(strict=True)
        except FileNotFoundError:
            raise NotInStore(f"{what} {path} is missing") from None
        except (OSError, RuntimeError) as err:
            raise OllamaStoreError(f"{what} {path}: {err}") from None
        if not real.is_relative_to(self.root):
            raise OllamaStoreError(
                f"{what} {path} is a link to {real}, outside the store {self.root}: refused"
            )
        try:
            # O_NOFOLLOW: a link put in its place since it was resolved is refused; O_NONBLOCK:
            # a FIFO is refused below rather than waited on.
            fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as err:
            raise OllamaStoreError(f"{what} {path}: {err.strerror}") from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise OllamaStoreError(f"{what} {path} is not a regular file: refused")
        return fd, info.st_size

    def open_blob(self, blob: Blob) -> tuple[int, int]:
        return self.open_regular(blob.path, f"blob {blob}")

    # --- the manifest ---------------------------------------------------------------------

    def read_manifest(self, ref: Reference) -> dict[str, Any]:
        path = self.manifest_path(ref)
        if not path.parent.is_dir():
            raise NotInStore(
                f"no model {ref.short} in the Ollama store {self.root} (`ollama pull "
                f"{ref.short}` first, or give --store DIR)"
            )
        if not path.exists() and not path.is_symlink():
            has = ""
            if path.parent.resolve().is_relative_to(self.root):
                tags = sorted(p.name for p in path.parent.iterdir() if p.is_file())[:20]
                has = f" (it has {', '.join(tags)})" if tags else ""
            raise NotInStore(f"no tag {ref.tag!r} of {ref.short} in {self.root}{has}")
        fd, size = self.open_regular(path, f"manifest of {ref.short}")
        with os.fdopen(fd, "rb") as f:
            if size > MAX_MANIFEST_BYTES:
                raise OllamaStoreError(
                    f"manifest {path} is {size} bytes, more than {MAX_MANIFEST_BYTES}: refused"
                )
            raw = f.read(MAX_MANIFEST_BYTES + 1)
        if len(raw) > MAX_MANIFEST_BYTES:
            raise OllamaStoreError(f"manifest {path} is more than {MAX_MANIFEST_BYTES} bytes")
        try:
            doc = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError) as err:
            raise OllamaStoreError(f"manifest {path} is not JSON: {err}") from None
        if not isinstance(doc, dict):
            raise OllamaStoreError(f"manifest {path} is not a JSON object")
        if doc.get("schemaVersion") != 2:
            raise OllamaStoreError(
                f"manifest {path}: schemaVersion {doc.get('schemaVersion')!r}, not 2"
            )
        return doc

    def layers(self, ref: Reference, doc: dict[str, Any]) -> list[_Layer]:
        where = f"manifest of {ref.short}"
        config = doc.get("config")
        if config is not None:
            if not isinstance(config, dict):
                raise OllamaStoreError(f"{where}: config is not an object")
            digest_hex(config.get("digest"))
        raw = doc.get("layers")
        if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_LAYERS:
            raise OllamaStoreError(f"{where}: layers must be a list of 1 to {MAX_LAYERS}")
        out = []
        for i, layer in enumerate(raw):
            if not isinstance(layer, dict):
                raise OllamaStoreError(f"{where}: layers[{i}] is not an object")
            media, size = layer.get("mediaType"), layer.get("size")
            if not isinstance(media, str):
                raise OllamaStoreError(f"{where}: layers[{i}].mediaType is not a string")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise OllamaStoreError(f"{where}: layers[{i}].size is not a byte count")
            try:
                digest = digest_hex(layer.get("digest"))
            except OllamaStoreError as err:
                raise OllamaStoreError(f"{where}: layers[{i}]: {err}") from None
            out.append(_Layer(media, digest, size))
        return out

    # --- layers ---------------------------------------------------------------------------

    def blob(self, layer: _Layer) -> Blob:
        """The layer's blob, checked for place, kind and size but not hashed."""
        blob = Blob(layer.digest, layer.size, self.blob_path(layer.digest))
        fd, size = self.open_blob(blob)
        os.close(fd)
        if size != layer.size:
            raise OllamaStoreError(
                f"blob {blob} is {size} bytes, the manifest says {layer.size}: corrupt, or "
                "still downloading"
            )
        return Blob(layer.digest, layer.size, blob.path.resolve())

    def read_text(self, layer: _Layer, what: str) -> str:
        """A small layer, hashed as it is read."""
        # Imported here, not above: workers/ollama/blobs.py imports this module.
        from workers.ollama.blobs import hashed_chunks

        blob = self.blob(layer)
        if blob.size > MAX_TEXT_BYTES:
            raise OllamaStoreError(
                f"{what} layer {blob} is {blob.size} bytes, more than {MAX_TEXT_BYTES}: refused"
            )
        fd, _ = self.open_blob(blob)
        with os.fdopen(fd, "rb") as f:
            data = b"".join(hashed_chunks(f, blob))
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise OllamaStoreError(f"{what} layer {blob} is not UTF-8 text") from None

    def load(self, ref: Reference) -> OllamaModel:
        """The model the name points to: its manifest validated, its text layers read and
        verified, its weights found (a GGUF file of the manifest's size) but not yet hashed."""
        # Imported here, not above: workers/ollama/gguf_header.py imports this module.
        from workers.ollama.gguf_header import check_gguf

        manifest = self.manifest_path(ref)
        layers = self.layers(ref, self.read_manifest(ref))
        models = [layer for layer in layers if layer.media_type == MODEL]
        if not models:
            kinds = ", ".join(sorted({layer.media_type for layer in layers}))
            raise OllamaStoreError(
                f"{ref.short} has no {MODEL} layer (it has {kinds}): llmgw imports GGUF models"
            )
        if len(models) > 1:
            raise OllamaStoreError(
                f"{ref.short} has {len(models)} {MODEL} layers; llmgw imports a model with one"
            )
        weights = self.blob(models[0])
        check_gguf(self, weights)
        adapters, projectors = [], []
        template = system = None
        params: dict[str, Any] = {}
        unused: dict[str, int] = {}
        # Later layers of a kind replace earlier ones, as in Ollama.
        for layer in layers:
            if layer.media_type == MODEL:
                continue
            if layer.media_type == ADAPTER:
                adapters.append(self.blob(layer))
            elif layer.media_type == PROJECTOR:
                projectors.append(self.blob(layer))
            elif layer.media_type == TEMPLATE:
                template = self.read_text(layer, "template")
            elif layer.media_type == SYSTEM:
                system = self.read_text(layer, "system")
            elif layer.media_type == PARAMS:
                params = parse_params(self.read_text(layer, "params"), layer.digest)
            else:
                unused[layer.media_type] = unused.get(layer.media_type, 0) + 1
        return OllamaModel(
            reference=ref,
            manifest=manifest,
            model=weights,
            adapters=adapters,
            projectors=projectors,
            template=template,
            system=system,
            params=params,
            unused=unused,
        )


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def parse_params(text: str, digest: str) -> dict[str, Any]:
    try:
        params = json.loads(text, parse_constant=_no_constant)
    except ValueError as err:
        raise OllamaStoreError(f"params layer sha256:{digest} is not JSON: {err}") from None
    if not isinstance(params, dict):
        raise OllamaStoreError(f"params layer sha256:{digest} is not a JSON object")
    return params
