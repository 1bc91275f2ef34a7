"""`model add --from`: which file inside the artifact a model runs, and the definition checked
before anything is downloaded."""

from argparse import Namespace
from typing import cast

import pytest

from workers.model_from_source import DIGEST_UNKNOWN_YET, lora_sources, weights_inside, with_source
from workflows.catalog import check_model
from workflows.contracts import ArtifactFile, ArtifactManifest, LoraAdapter, ModelSpec, Profile
from workflows.replica.rules import artifacts_to_fetch


def manifest(*paths: str) -> ArtifactManifest:
    return ArtifactManifest(
        files=[ArtifactFile(path=p, digest="sha256:" + "1" * 64, size=1) for p in paths]
    )


def test_the_only_file_or_the_only_gguf_is_run() -> None:
    assert weights_inside(manifest("model.Q4.gguf"), None, "llamacpp") == "model.Q4.gguf"
    two = manifest("README.md", "model.gguf")
    assert weights_inside(two, None, "llamacpp") == "model.gguf"
    # vLLM and the other engines take the artifact's whole directory.
    assert weights_inside(manifest("config.json", "model.safetensors"), None, "vllm") == ""


def test_a_named_file_must_be_in_the_artifact_and_several_ggufs_need_a_name() -> None:
    both = manifest("a.gguf", "b.gguf")
    assert weights_inside(both, "b.gguf", "llamacpp") == "b.gguf"
    with pytest.raises(SystemExit, match="2 GGUF files: name one with --weights"):
        weights_inside(both, None, "llamacpp")
    with pytest.raises(SystemExit, match=r"--weights c\.gguf: not in the artifact"):
        weights_inside(both, "c.gguf", "llamacpp")


def test_the_definition_is_checked_with_the_path_inside_before_any_download() -> None:
    spec = ModelSpec(name="m", memory_mb=2048)
    assert check_model(with_source(spec, "model.gguf", from_source=True)) == []
    assert with_source(spec, None, from_source=True).artifact == DIGEST_UNKNOWN_YET
    problems = check_model(with_source(spec, "../../etc/passwd", from_source=True))
    assert any(p.startswith("weights: with an artifact, a path") for p in problems)


def test_adapters_from_sources_are_checked_before_the_downloads() -> None:
    spec = ModelSpec(
        name="m",
        memory_mb=2048,
        lora=[LoraAdapter(name="sql", path=""), LoraAdapter(name="x", path="/a/x.gguf")],
    )
    ready = with_source(spec, None, from_source=False, adapters=["sql"])
    by_name = {a.name: a for a in ready.profiles[0].lora}
    assert by_name["sql"].artifact == DIGEST_UNKNOWN_YET
    assert (by_name["x"].artifact, by_name["x"].path) == ("", "/a/x.gguf")
    assert spec.profiles[0].lora[0].artifact == "", "the definition given is left as it was"
    assert lora_sources(Namespace(lora_from=["sql=https://h/sql.gguf"])) == {
        "sql": "https://h/sql.gguf"
    }
    with pytest.raises(SystemExit, match="--lora-from wants NAME=SOURCE"):
        lora_sources(Namespace(lora_from=["sql"]))


def test_a_replica_fetches_its_weights_and_its_profiles_adapters_once_each() -> None:
    adapter = "sha256:" + "2" * 64
    weights = "sha256:" + "3" * 64
    spec = ModelSpec(
        name="m",
        artifact=weights,
        profiles=[
            Profile(lora=[LoraAdapter(name="a", path="", artifact=adapter)]),
            Profile(lora=[LoraAdapter(name="b", path="/b.gguf")]),
        ],
    )
    assert artifacts_to_fetch(spec, 0) == [weights, adapter]
    assert artifacts_to_fetch(spec, 1) == [weights]
    assert artifacts_to_fetch(ModelSpec(name="m", weights="/w.gguf"), 0) == []


def fingerprinted_adapters(profile: Profile) -> list[dict[str, str]]:
    """The profile's adapters as its fingerprint sees them: each LoraAdapter dumped, every
    field a string."""
    return cast(list[dict[str, str]], profile.fingerprint_fields()["lora"])


def test_an_adapter_without_an_artifact_keeps_its_fingerprint() -> None:
    # Adapters defined before artifacts existed: their fingerprint, and so the running
    # replicas, must not change when llmgw is upgraded.
    profile = Profile(lora=[LoraAdapter(name="a", path="/a.gguf")])
    assert "artifact" not in fingerprinted_adapters(profile)[0]
    fetched = Profile(lora=[LoraAdapter(name="a", path="a.gguf", artifact="sha256:" + "4" * 64)])
    assert fingerprinted_adapters(fetched)[0]["artifact"].startswith("sha256:")
