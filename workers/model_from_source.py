"""`llmgw model add NAME --from SOURCE`: the weights into the control plane's mirror, then the
model defined by the artifact's digest, so no node needs a path of its own: each node running a
replica fetches the artifact from `llmgw mirror serve` first (workflows/replica_calls.py).

Runs where the mirror's files are (the control plane's state dir), like `llmgw mirror add`.
The definition is checked before anything is downloaded, and again once the artifact's files
are known."""

from __future__ import annotations

import argparse

from activities.control.mirror.errors import MirrorError
from activities.control.mirror.sources import BadSource
from activities.control.mirror.store import MirrorStore
from workers.mirror_commands import mirror_add, show_added
from workers.paths import Locations
from workflows.artifact_names import BadArtifact
from workflows.contracts import ArtifactManifest, ModelSpec

# Stands in for the artifact's digest while the definition is checked before the download:
# the checks need a digest's form, not its value.
DIGEST_UNKNOWN_YET = "sha256:" + "0" * 64


def with_source(spec: ModelSpec, weights_inside: str | None) -> ModelSpec:
    """The model as it is checked before the download: weights from an artifact."""
    return spec.model_copy(update={"artifact": DIGEST_UNKNOWN_YET, "weights": weights_inside or ""})


def weights_inside(manifest: ArtifactManifest, given: str | None, engine: str) -> str:
    """The path the engine runs inside the artifact: the one given (it must be there), the only
    file, the only GGUF file for llama.cpp, or "" (the artifact's directory, as vLLM, SGLang and
    TensorRT-LLM take a model)."""
    paths = [f.path for f in manifest.files]
    if given:
        if given not in paths:
            raise SystemExit(f"--weights {given}: not in the artifact ({', '.join(paths[:8])})")
        return given
    if len(paths) == 1:
        return paths[0]
    if engine == "llamacpp":
        ggufs = [p for p in paths if p.lower().endswith(".gguf")]
        if len(ggufs) != 1:
            raise SystemExit(
                f"the artifact has {len(ggufs)} GGUF files: name one with --weights PATH"
            )
        return ggufs[0]
    return ""


def mirrored_spec(where: Locations, args: argparse.Namespace, spec: ModelSpec) -> ModelSpec:
    """Add the source to the mirror under the model's name and return the model defined by it."""
    try:
        added = mirror_add(MirrorStore(where.mirror_dir), args, name=spec.name)
    except (MirrorError, BadSource, BadArtifact) as err:
        raise SystemExit(f"model add {spec.name} --from {args.source}: {err}") from None
    show_added(added)
    inside = weights_inside(added.manifest, args.weights, spec.engine)
    return spec.model_copy(update={"artifact": added.digest, "weights": inside})
