"""`model add --from`: which file inside the artifact a model runs, and the definition checked
before anything is downloaded."""

import pytest

from workers.model_from_source import DIGEST_UNKNOWN_YET, weights_inside, with_source
from workflows.catalog import check_model
from workflows.contracts import ArtifactFile, ArtifactManifest, ModelSpec


def manifest(*paths: str) -> ArtifactManifest:
    return ArtifactManifest(
        files=[ArtifactFile(path=p, digest="sha256:" + "1" * 64, size=1) for p in paths]
    )


def test_the_only_file_or_the_only_gguf_is_run():
    assert weights_inside(manifest("model.Q4.gguf"), None, "llamacpp") == "model.Q4.gguf"
    two = manifest("README.md", "model.gguf")
    assert weights_inside(two, None, "llamacpp") == "model.gguf"
    # vLLM and the other engines take the artifact's whole directory.
    assert weights_inside(manifest("config.json", "model.safetensors"), None, "vllm") == ""


def test_a_named_file_must_be_in_the_artifact_and_several_ggufs_need_a_name():
    both = manifest("a.gguf", "b.gguf")
    assert weights_inside(both, "b.gguf", "llamacpp") == "b.gguf"
    with pytest.raises(SystemExit, match="2 GGUF files: name one with --weights"):
        weights_inside(both, None, "llamacpp")
    with pytest.raises(SystemExit, match=r"--weights c\.gguf: not in the artifact"):
        weights_inside(both, "c.gguf", "llamacpp")


def test_the_definition_is_checked_with_the_path_inside_before_any_download():
    spec = ModelSpec(name="m", memory_mb=2048)
    assert check_model(with_source(spec, "model.gguf")) == []
    assert with_source(spec, None).artifact == DIGEST_UNKNOWN_YET
    problems = check_model(with_source(spec, "../../etc/passwd"))
    assert any(p.startswith("weights: with an artifact, a path") for p in problems)
