"""Where a model's weights are on this node: the path its profile names, or the file inside the
mirror artifact the node fetched (activities/agent/artifact_store.py), usable only once the
fetch wrote the artifact's completion marker."""

from __future__ import annotations

from pathlib import Path

from workflows.artifact_names import COMPLETE_MARKER, hex_of
from workflows.contracts import ModelSpec


class WeightsMissing(Exception):
    """The weights are not (all) here: the message names the model and what is missing."""


def weights_on_node(model: ModelSpec, artifacts_root: Path) -> Path:
    if not model.artifact:
        path, what = Path(model.weights), f"weights {model.weights}"
    else:
        directory = artifacts_root / hex_of(model.artifact)
        if not (directory / COMPLETE_MARKER).exists():
            raise WeightsMissing(f"artifact {model.artifact} of model {model.name} is not fetched")
        path = directory / model.weights if model.weights else directory
        what = f"{model.weights or 'the weights'} of artifact {model.artifact}"
    if not path.exists():
        raise WeightsMissing(f"{what} for model {model.name} not found")
    return path
