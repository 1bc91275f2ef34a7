"""`llmgw model add NAME --from SOURCE`: the weights into the control plane's mirror, then the
model defined by the artifact's digest, so no node needs a path of its own: each node running a
replica fetches the artifact from `llmgw mirror serve` first (workflows/replica/calls.py).

Runs where the mirror's files are (the control plane's state dir), like `llmgw mirror add`.
The definition is checked before anything is downloaded, and again once the artifact's files
are known."""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from activities.control.mirror.add import Added
from activities.control.mirror.errors import MirrorError
from activities.control.mirror.sources import BadSource
from activities.control.mirror.store import MirrorStore
from workers.commands.mirror import mirror_add, show_added
from workers.paths import Locations
from workflows.artifact_names import BadArtifact
from workflows.contracts import ArtifactManifest, ModelSpec
from workflows.contracts.engine_facts import engine_facts

# Stands in for the artifact's digest while the definition is checked before the download:
# the checks need a digest's form, not its value.
DIGEST_UNKNOWN_YET = "sha256:" + "0" * 64


def with_source(
    spec: ModelSpec, weights_inside: str | None, from_source: bool, adapters: Iterable[str] = ()
) -> ModelSpec:
    """The model as it is checked before the downloads: weights (when `from_source`) and the
    named adapters from artifacts whose digests are not known yet."""
    if from_source:
        update = {"artifact": DIGEST_UNKNOWN_YET, "weights": weights_inside or ""}
        spec = spec.model_copy(update=update)
    placeholder = {name: (DIGEST_UNKNOWN_YET, "") for name in adapters}
    return with_adapters(spec, placeholder) if placeholder else spec


def with_adapters(spec: ModelSpec, artifacts: dict[str, tuple[str, str]]) -> ModelSpec:
    """The model with the named adapters of its first profile taken from artifacts: name ->
    (manifest digest, path inside)."""
    profile = spec.profiles[0]
    lora = [
        a.model_copy(update={"artifact": artifacts[a.name][0], "path": artifacts[a.name][1]})
        if a.name in artifacts
        else a
        for a in profile.lora
    ]
    profiles = [profile.model_copy(update={"lora": lora}), *spec.profiles[1:]]
    return spec.model_copy(update={"profiles": profiles})


def weights_inside(manifest: ArtifactManifest, given: str | None, engine: str) -> str:
    """The path the engine runs inside the artifact: the one given (it must be there), the only
    file, the only file of the kind its engine loads (its row's weights_suffix: GGUF for
    llama.cpp), or "" (the artifact's directory, as vLLM, SGLang and TensorRT-LLM take a
    model)."""
    paths = [f.path for f in manifest.files]
    if given:
        if given not in paths:
            raise SystemExit(f"--weights {given}: not in the artifact ({', '.join(paths[:8])})")
        return given
    if len(paths) == 1:
        return paths[0]
    facts = engine_facts(engine)
    suffix = facts.weights_suffix if facts is not None else None
    if suffix is not None:
        files = [p for p in paths if p.lower().endswith(suffix)]
        if len(files) != 1:
            raise SystemExit(
                f"the artifact has {len(files)} {suffix.lstrip('.').upper()} files: "
                "name one with --weights PATH"
            )
        return files[0]
    return ""


def mirrored_spec(where: Locations, args: argparse.Namespace, spec: ModelSpec) -> ModelSpec:
    """Add the weights' source (--from) and each adapter's (--lora-from) to the mirror, and
    return the model defined by them. The weights go under the model's name, an adapter under
    "<model>.lora.<adapter>"."""
    store = MirrorStore(where.mirror_dir)
    if args.source:
        added = _add(store, args, spec.name, args.source)
        inside = weights_inside(added.manifest, args.weights, spec.engine)
        # The size too: a node that must fetch the weights needs the disk for them.
        update = {"artifact": added.digest, "artifact_size": added.manifest.size}
        spec = spec.model_copy(update={**update, "weights": inside})
    fetched: dict[str, tuple[str, str]] = {}
    for name, source in lora_sources(args).items():
        added = _add(store, args, f"{spec.name}.lora.{name}", source)
        fetched[name] = (added.digest, weights_inside(added.manifest, None, spec.engine))
    return with_adapters(spec, fetched) if fetched else spec


def lora_sources(args: argparse.Namespace) -> dict[str, str]:
    """--lora-from NAME=SOURCE, by adapter name."""
    found: dict[str, str] = {}
    for value in getattr(args, "lora_from", None) or []:
        name, sep, source = value.partition("=")
        if not sep or not name or not source:
            raise SystemExit(f"--lora-from wants NAME=SOURCE, got {value!r}")
        found[name] = source
    return found


def _add(store: MirrorStore, args: argparse.Namespace, name: str, source: str) -> Added:
    try:
        added = mirror_add(store, args, name=name, text=source)
    except (MirrorError, BadSource, BadArtifact) as err:
        raise SystemExit(f"model add: {source}: {err}") from None
    show_added(added)
    return added
