"""Where a model's weights are on this node: the path its profile names, or the file inside the
mirror artifact the node fetched (activities/agent/artifact_store.py), usable only once the
fetch wrote the artifact's completion marker."""

from __future__ import annotations

from pathlib import Path

from workflows.artifact_names import COMPLETE_MARKER, hex_of
from workflows.contracts import ModelSpec, Profile


class WeightsMissing(Exception):
    """The weights are not (all) here: the message names the model and what is missing."""


def weights_on_node(model: ModelSpec, artifacts_root: Path) -> Path:
    if not model.artifact:
        path, what = Path(model.weights), f"weights {model.weights}"
    else:
        path = _in_artifact(artifacts_root, model.artifact, model.weights, f"model {model.name}")
        what = f"{model.weights or 'the weights'} of artifact {model.artifact}"
    if not path.exists():
        raise WeightsMissing(f"{what} for model {model.name} not found")
    return path


def adapters_on_node(profile: Profile, model: str, artifacts_root: Path) -> Profile:
    """The profile with each adapter fetched from the mirror at its path on this node (the
    others as the profile names them)."""
    if not any(a.artifact for a in profile.lora):
        return profile
    lora = []
    for adapter in profile.lora:
        if adapter.artifact:
            of = f"adapter {adapter.name} of model {model}"
            path = _in_artifact(artifacts_root, adapter.artifact, adapter.path, of)
            if not path.exists():
                raise WeightsMissing(f"{adapter.path or 'the directory'} of {of} not found")
            adapter = adapter.model_copy(update={"path": str(path)})
        lora.append(adapter)
    return profile.model_copy(update={"lora": lora})


def _in_artifact(root: Path, artifact: str, inside: str, of: str) -> Path:
    directory = root / hex_of(artifact)
    if not (directory / COMPLETE_MARKER).exists():
        raise WeightsMissing(f"artifact {artifact} of {of} is not fetched")
    return directory / inside if inside else directory
