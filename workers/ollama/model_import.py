"""`llmgw model import-ollama NAME[:TAG]`: serve a model Ollama has already pulled.

The model's GGUF (and any LoRA adapter) is copied out of the Ollama store into llmgw's own
models directory, `<state>/models/sha256-<hex>.gguf`, hashed while it is copied and renamed
into place only when it matches its digest; a file already there is reused once it hashes
right. The model is then defined as `llmgw model add` defines one (commands/model.py), engine
llamacpp, weights that path. Nothing here needs a server (tests/unit/test_ollama_store.py).

What of Ollama's model llama-server can use, and how:
- params: the sampling options become llama-server flags that set the server's defaults (a
  request's own value still wins): `stop` -> `--reverse-prompt` once per word, `temperature`
  -> `--temp`, ... (PARAM_FLAGS); `num_ctx` -> the profile's context size. The rest
  (`num_gpu`, `num_thread`, ...) are llmgw's or the engine's to decide and are left out.
- template: not used. Ollama's is a Go template, which llama-server cannot take; it applies the
  Jinja chat template embedded in the GGUF (a warning when there is none).
- system: not used: llama-server has no server-wide default system prompt.
- adapter: each becomes a LoRA adapter of the profile (`adapter`, `adapter-2`, ...).
- projector: copied beside the weights like them and served with llama-server's `--mmproj`,
  so chat requests may carry images. llama-server takes one projector: with more, the first is
  used, with a warning. An operator's own `--arg --mmproj ...` wins.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from engines.llamacpp import RESERVED_FLAGS
from workers.ollama.blobs import copy_verified
from workers.ollama.gguf_header import gguf_has_chat_template
from workers.ollama.store import (
    DEFAULT_NAMESPACE,
    DEFAULT_TAG,
    LICENSE,
    Blob,
    OllamaModel,
    OllamaStore,
    OllamaStoreError,
    Reference,
    default_store,
    parse_reference,
)
from workflows.contracts import LoraAdapter, ModelSpec, Profile

ENGINE = "llamacpp"
SUFFIX = ".gguf"
# Ollama's options that llama-server takes as server-wide defaults for each request: the flag
# that sets each (long forms, as `llama-server --help` of the pinned build lists them).
PARAM_FLAGS = {
    "temperature": "--temp",
    "top_k": "--top-k",
    "top_p": "--top-p",
    "min_p": "--min-p",
    "typical_p": "--typical",
    "repeat_last_n": "--repeat-last-n",
    "repeat_penalty": "--repeat-penalty",
    "presence_penalty": "--presence-penalty",
    "frequency_penalty": "--frequency-penalty",
    "seed": "--seed",
    "num_predict": "--n-predict",
    "num_keep": "--keep",
    "mirostat": "--mirostat",
    "mirostat_tau": "--mirostat-ent",
    "mirostat_eta": "--mirostat-lr",
}
INTEGER_PARAMS = frozenset(
    {"top_k", "repeat_last_n", "seed", "num_predict", "num_keep", "mirostat", "num_ctx"}
)
STOP_FLAG = "--reverse-prompt"
MAX_STOP_WORDS = 32
MIN_CONTEXT = 256
DEFAULT_CONTEXT = 4096
DEFAULT_MEMORY_MB = 1024
# A CPU replica's memory beyond its weights: KV cache, buffers.
HEADROOM_MB = 512
MIB = 1 << 20
# Told (blob, bytes copied so far) while a blob is copied.
BlobProgress = Callable[[Blob, int], None]


@dataclass(frozen=True)
class EngineDefaults:
    """What of Ollama's parameters reaches llama-server."""

    args: list[str] = field(default_factory=list)
    context_size: int | None = None
    left_out: list[str] = field(default_factory=list)


def engine_defaults(params: dict[str, Any]) -> EngineDefaults:
    """llama-server flags for Ollama's params; a malformed value is refused, naming it."""
    args: list[str] = []
    left_out: list[str] = []
    context: int | None = None
    for name in sorted(params):
        value = params[name]
        if name == "stop":
            stop_args, skipped = stop_words(value)
            args += stop_args
            left_out += skipped
        elif name == "num_ctx":
            size = int(_number(name, value))
            if size < MIN_CONTEXT:
                left_out.append(f"num_ctx {size} (llmgw's context size is at least {MIN_CONTEXT})")
            else:
                context = size
        elif name in PARAM_FLAGS:
            args += [PARAM_FLAGS[name], _format(_number(name, value))]
        else:
            left_out.append(name)
    return EngineDefaults(args=args, context_size=context, left_out=left_out)


def stop_words(value: object) -> tuple[list[str], list[str]]:
    words = [value] if isinstance(value, str) else value
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise OllamaStoreError(f"params: stop is {value!r}, not a list of strings")
    args: list[str] = []
    skipped: list[str] = []
    for word in dict.fromkeys(words):  # in order, each once
        if not word:
            continue
        if "\0" in word or word.split("=", 1)[0] in RESERVED_FLAGS:
            skipped.append(f"stop {word!r} (it cannot be passed on llama-server's command line)")
        elif len(args) // 2 >= MAX_STOP_WORDS:
            skipped.append(f"stop {word!r} (more than {MAX_STOP_WORDS} stop words)")
        else:
            args += [STOP_FLAG, word]
    return args, skipped


def _number(name: str, value: object) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise OllamaStoreError(f"params: {name} is {value!r}, not a number")
    if name in INTEGER_PARAMS:
        if isinstance(value, float) and not value.is_integer():
            raise OllamaStoreError(f"params: {name} is {value!r}, not a whole number")
        return int(value)
    return value


def _format(value: int | float) -> str:
    return str(value) if isinstance(value, int) else repr(value)


def default_model_name(ref: Reference) -> str:
    """The Ollama name as an llmgw model name: `smollm2:135m` -> `smollm2-135m`, `llama3` and
    `llama3:latest` -> `llama3`, `team/m:v1` -> `team-m-v1`; lowercase, and every character
    llmgw's names do not take (`:`, `/`) as `-`."""
    parts = [ref.model] if ref.namespace == DEFAULT_NAMESPACE else [ref.namespace, ref.model]
    if ref.tag != DEFAULT_TAG:
        parts.append(ref.tag)
    name = re.sub(r"[^a-z0-9._-]", "-", "-".join(parts).lower())
    return name.lstrip("._-")[:63]


def adapter_names(count: int) -> list[str]:
    return ["adapter" if i == 0 else f"adapter-{i + 1}" for i in range(count)]


@dataclass(frozen=True)
class ImportPlan:
    """What an import will copy and define, worked out before anything is copied."""

    store: OllamaStore
    found: OllamaModel
    spec: ModelSpec
    models_dir: Path
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def blobs(self) -> list[Blob]:
        """The weights, the adapters, and the projector when the profile serves it."""
        args = self.spec.profiles[0].args
        used = [p for p in self.found.projectors if str(content_path(self.models_dir, p)) in args]
        return [self.found.model, *self.found.adapters, *used]


def content_path(models_dir: Path, blob: Blob) -> Path:
    return models_dir / f"{blob.name}{SUFFIX}"


def plan_import(args: argparse.Namespace, models_dir: Path, env: dict[str, str]) -> ImportPlan:
    """Read and check the Ollama model (`args.reference` in `args.store`) and build the llmgw
    model the import defines. Copies nothing."""
    store = OllamaStore(Path(args.store) if args.store else default_store())
    ref = parse_reference(args.reference)
    found = store.load(ref)
    name = args.as_name or default_model_name(ref)
    if not name:
        raise OllamaStoreError(f"{ref.short} makes no llmgw model name: give --as MODEL")
    defaults = EngineDefaults() if args.no_params else engine_defaults(found.params)
    notes, warnings = describe(found, defaults, args.no_params)
    lora = [
        LoraAdapter(name=n, path=str(content_path(models_dir, blob)))
        for n, blob in zip(adapter_names(len(found.adapters)), found.adapters, strict=True)
    ]
    if lora:
        warnings.append(
            f"{ref.short} has {len(lora)} LoRA adapter layer(s), loaded as "
            f"{', '.join(a.name for a in lora)}: llama.cpp replicas load adapters unapplied and "
            "llmgw does not apply them yet, so requests get the base model, not the model "
            "Ollama serves"
        )
    context = args.context_size or defaults.context_size or DEFAULT_CONTEXT
    memory = args.memory_mb or default_memory_mb(found, args.gpu_class)
    profile = Profile(
        engine=ENGINE,
        engine_version=args.engine_version,
        gpu_class=args.gpu_class,
        gpus_per_node=args.gpus_per_node,
        cpu_cores=args.cpu_cores,
        memory_mb=memory,
        context_size=context,
        parallel=args.parallel,
        args=[*defaults.args, *projector_args(found, models_dir, args.arg), *args.arg],
        env=env,
        lora=lora,
    )
    spec = ModelSpec(
        name=name,
        weights=str(content_path(models_dir, found.model)),
        replicas=args.replicas,
        min_replicas=args.min_replicas,
        max_replicas=max(args.max_replicas, args.replicas),
        profiles=[profile],
    )
    return ImportPlan(store, found, spec, models_dir, notes, warnings)


# llama-server's flag for a multimodal projector; an operator's own one (or its URL form) wins.
MMPROJ = "--mmproj"
OPERATOR_PROJECTOR_FLAGS = frozenset({MMPROJ, "-mm", "--mmproj-url", "-mmu"})


def projector_args(found: OllamaModel, models_dir: Path, operator_args: list[str]) -> list[str]:
    """`--mmproj <copy>` for the model's first projector layer, unless the operator gave one."""
    if not found.projectors or OPERATOR_PROJECTOR_FLAGS & set(operator_args):
        return []
    return [MMPROJ, str(content_path(models_dir, found.projectors[0]))]


def default_memory_mb(found: OllamaModel, gpu_class: str | None) -> int:
    """A CPU replica holds its weights in memory: their size and headroom, at least what
    `model add` assumes. On GPUs the weights go to the GPUs."""
    if gpu_class is not None:
        return DEFAULT_MEMORY_MB
    size = sum(blob.size for blob in (found.model, *found.adapters, *found.projectors[:1]))
    return max(DEFAULT_MEMORY_MB, math.ceil(size / MIB) + HEADROOM_MB)


def describe(
    found: OllamaModel, defaults: EngineDefaults, no_params: bool
) -> tuple[list[str], list[str]]:
    """What is carried over and what is not, in words for the operator."""
    notes: list[str] = []
    warnings: list[str] = []
    if no_params:
        notes.append("params: left out (--no-params)")
    elif found.params:
        carried = " ".join(_shell_word(a) for a in defaults.args) or "none"
        notes.append(f"params: llama-server defaults {carried}")
        if defaults.context_size is not None:
            notes.append(f"params: num_ctx {defaults.context_size} as the context size")
        if defaults.left_out:
            notes.append(f"params not carried: {', '.join(defaults.left_out)}")
    if found.template is not None:
        notes.append(
            "template: Ollama's Go template is not used; llama-server applies the chat template "
            "embedded in the GGUF"
        )
    if gguf_has_chat_template(found.model.path) is False:
        warnings.append(
            "the GGUF embeds no chat template (tokenizer.chat_template): llama-server falls "
            "back to its default (chatml) for chat requests"
        )
    if found.system is not None:
        warnings.append(
            "system: Ollama's default system prompt is not used (llama-server has no "
            "server-wide one); clients send it as the first message"
        )
    if found.projectors:
        notes.append(
            f"projector: {found.projectors[0]} served with llama-server's --mmproj (chat "
            "requests may carry images)"
        )
    if len(found.projectors) > 1:
        warnings.append(
            f"projector: {len(found.projectors)} projector layers; llama-server takes one, so "
            f"only {found.projectors[0]} is used"
        )
    unused = {k: v for k, v in found.unused.items() if k != LICENSE}
    if unused:
        notes.append(f"layers not used: {', '.join(sorted(unused))}")
    return notes, warnings


def _shell_word(arg: str) -> str:
    return arg if arg and all(c.isalnum() or c in "-._/" for c in arg) else repr(arg)


def fetch_blobs(plan: ImportPlan, progress: BlobProgress | None = None) -> list[str]:
    """Copy (or reuse) each blob the model needs at its content-addressed path, verified.
    Returns a line for each. `progress` is told (blob, bytes copied) as each is copied."""
    lines = []
    for blob in plan.blobs:
        each = None if progress is None else partial(progress, blob)
        path, reused = copy_verified(plan.store, blob, plan.models_dir, SUFFIX, each)
        how = "already there, verified" if reused else "copied and verified"
        lines.append(f"{blob}: {path} ({how}, {blob.size} bytes)")
    return lines
