"""Catalog validation: what an operator gets told when a definition cannot run."""

from typing import Any

import pytest
from pydantic import ValidationError

from workflows.catalog import check_model, check_profile
from workflows.contracts import Autoscale, ModelSpec, Profile


def problems(**fields: Any) -> list[str]:
    return check_profile(Profile(**fields))


def test_the_demo_style_cpu_profile_is_fine() -> None:
    assert problems(engine="llamacpp", memory_mb=512) == []


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"engine": "vllm2"}, "engine: 'vllm2' is not one of"),
        ({"engine": "sglang", "memory_mb": 512}, "gpu_class: sglang needs a GPU class"),
        ({"engine": "llamacpp"}, "memory_mb: a CPU profile must declare"),
        ({"engine": "llamacpp", "memory_mb": 512, "gpus_per_node": 2}, "gpus_per_node: set"),
        ({"engine": "vllm", "gpu_class": "h100-80g"}, "gpus_per_node: a profile on h100-80g"),
        (
            {"engine": "vllm", "gpu_class": "h100-80g", "gpus_per_node": 4, "tensor_parallel": 2},
            "tensor_parallel x pipeline_parallel: 2 x 1 must equal",
        ),
        (
            {
                "engine": "vllm",
                "gpu_class": "a100-80g-mig-3g.40gb",
                "gpus_per_node": 2,
                "tensor_parallel": 2,
            },
            "gpu_class: a100-80g-mig-3g.40gb is a MIG instance",
        ),
        (
            {"engine": "vllm", "gpu_class": "a100-80g", "gpus_per_node": 1, "quantization": "fp8"},
            "quantization: fp8 needs compute capability 8.9",
        ),
        (
            {"engine": "llamacpp", "gpu_class": "l40s-45g", "gpus_per_node": 1, "nodes": 2},
            "nodes: llamacpp replicas run on one node",
        ),
        ({"engine": "llamacpp", "memory_mb": 512, "kv_events": True}, "kv_events: llamacpp"),
        (
            {"engine": "vllm", "gpu_class": "h100-80g", "gpus_per_node": 1, "launch": "ray"},
            "launch: ray is for multi-node vLLM",
        ),
    ],
)
def test_each_mistake_names_its_field(fields: dict[str, Any], expected: str) -> None:
    found = problems(**fields)
    assert any(p.startswith(expected) for p in found), found


@pytest.mark.parametrize(
    "name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "PATH", "PYTHONPATH", "BASH_ENV"]
)
def test_environment_that_changes_what_runs_is_refused(name: str) -> None:
    found = problems(engine="llamacpp", memory_mb=512, env={name: "x", "OMP_NUM_THREADS": "4"})
    assert [p.split(":")[0] for p in found] == [f"env.{name}"]


def test_a_multi_node_tensor_parallel_vllm_profile_adds_up() -> None:
    assert (
        problems(
            engine="vllm",
            gpu_class="h100-80g",
            gpus_per_node=8,
            nodes=2,
            tensor_parallel=8,
            pipeline_parallel=2,
        )
        == []
    )


def test_model_level_problems_name_the_profile_and_the_counts() -> None:
    spec = ModelSpec(
        name="m",
        weights="/w",
        replicas=5,
        max_replicas=3,
        profiles=[Profile(memory_mb=512), Profile(engine="sglang", memory_mb=512)],
    )
    found = check_model(spec)
    assert found[0].startswith("replicas: 5 is outside")
    assert found[1].startswith("profiles[1].gpu_class: sglang needs a GPU class")


def test_a_flat_definition_from_before_profiles_is_one_profile() -> None:
    spec = ModelSpec.model_validate(
        {"name": "m", "weights": "/w", "engine": "llamacpp", "cpu_cores": 3, "memory_mb": 700}
    )
    assert len(spec.profiles) == 1
    assert (spec.profiles[0].cpu_cores, spec.profiles[0].memory_mb) == (3, 700)
    assert check_model(spec) == []


def test_profile_fingerprints_change_with_the_profile_only() -> None:
    spec = ModelSpec(name="m", weights="/w", profiles=[Profile(memory_mb=512)])
    scaled = spec.model_copy(update={"replicas": 9})
    assert spec.fingerprints() == scaled.fingerprints()
    changed = spec.model_copy(deep=True)
    changed.profiles[0].context_size = 8192
    assert spec.fingerprints() != changed.fingerprints()


def test_a_model_name_that_could_escape_a_path_is_refused() -> None:
    with pytest.raises(ValidationError):
        ModelSpec(name="../etc", weights="/w")


def test_fingerprints_recorded_before_external_models_existed_stay_the_same() -> None:
    # The fingerprint a replica reported in tests/workflows/histories/Model.json: were it to
    # change, an upgrade would roll every running replica.
    spec = ModelSpec(name="m", weights="/w/model.gguf", replicas=2, engine_version="1")
    assert spec.profile_fingerprint(0) == "8985126ee49d3b27"


def external(*urls: str, **fields: Any) -> ModelSpec:
    return ModelSpec(name="ext", profiles=[Profile(engine="external", urls=list(urls), **fields)])


def test_an_external_model_needs_no_weights_and_has_a_replica_per_url() -> None:
    spec = ModelSpec.model_validate(
        {
            "name": "ext",
            "replicas": 7,
            "max_replicas": 1,
            "engine": "external",
            "urls": ["http://127.0.0.1:9000", "https://api.example.com/v1", "http://[::1]:9/v1/"],
        }
    )
    assert spec.replicas == 3
    assert spec.external
    assert check_model(spec) == []


def test_other_engines_still_need_weights() -> None:
    found = check_model(ModelSpec(name="m", profiles=[Profile(memory_mb=512)]))
    assert found == ["weights: engine llamacpp needs a GGUF file or model directory"]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("ftp://127.0.0.1/", "must start with http:// or https://"),
        ("127.0.0.1:9000", "must start with http:// or https://"),
        ("http://", "names no host"),
        ("http://127.0.0.1:9000/v1?key=1", "must have no query or fragment"),
        ("http://127.0.0.1:9000/#top", "must have no query or fragment"),
        ("http://127.0.0.1:99999", "is not a URL"),
        ("http://127.0.0.1:9000/v1\r\nX-Injected: 1", "has spaces or control characters"),
    ],
)
def test_an_external_url_must_be_a_plain_http_base(url: str, expected: str) -> None:
    found = check_model(external(url))
    assert len(found) == 1, found
    assert found[0].startswith("profiles[0].urls[0]: "), found
    assert expected in found[0]


def test_credentials_in_an_external_url_are_refused_without_repeating_them() -> None:
    found = check_model(external("http://127.0.0.1:9000", "https://user:s3cret@api.example.com"))
    assert len(found) == 1
    assert found[0].startswith("profiles[0].urls[1]: credentials do not go in the URL")
    assert "s3cret" not in found[0]


@pytest.mark.parametrize("count", [0, 65])
def test_an_external_model_has_one_to_64_urls(count: int) -> None:
    urls = [f"http://10.0.0.1:{9000 + i}" for i in range(count)]
    assert check_model(external(*urls)) == [
        f"profiles[0].urls: an external model needs 1 to 64, not {count}"
    ]


def test_the_same_endpoint_twice_is_refused() -> None:
    found = check_model(external("http://127.0.0.1:9000", "http://127.0.0.1:9000/v1/"))
    assert found == ["profiles[0].urls: the same endpoint is listed twice"]


@pytest.mark.parametrize(
    "fields",
    [
        {"gpu_class": "h100-80g"},
        {"gpus_per_node": 1},
        {"tensor_parallel": 2},
        {"pipeline_parallel": 2},
        {"nodes": 2},
        {"memory_mb": 2048},
        {"args": ["--foo"]},
        {"env": {"A": "1"}},
        {"kv_events": True},
        {"lora": [{"name": "a", "path": "/a"}]},
        {"engine_version": "1"},
    ],
)
def test_an_external_profile_refuses_what_only_a_launched_engine_uses(
    fields: dict[str, Any],
) -> None:
    (field,) = fields
    found = check_model(external("http://127.0.0.1:9000", **fields))
    assert found == [f"profiles[0].{field}: external endpoints run elsewhere; leave it unset"]


def test_an_external_model_has_exactly_one_profile_and_no_autoscaling() -> None:
    spec = ModelSpec(
        name="ext",
        autoscale=Autoscale(),
        profiles=[
            Profile(engine="external", urls=["http://127.0.0.1:9000"]),
            Profile(memory_mb=512),
        ],
    )
    found = check_model(spec)
    assert found[0].startswith("profiles: an external model has exactly one profile")
    assert found[1] == "autoscale: llmgw does not scale external endpoints"


def test_other_engines_refuse_urls() -> None:
    found = problems(engine="llamacpp", memory_mb=512, urls=["http://127.0.0.1:9000"])
    assert found == ["urls: only engine external takes URLs; llamacpp runs on the nodes"]


def test_an_upstream_model_name_is_for_external_models_only_and_plain() -> None:
    assert check_model(external("http://127.0.0.1:9000", upstream_model="org/Model-8B:q4")) == []
    found = problems(engine="llamacpp", memory_mb=512, upstream_model="gpt-4o-mini")
    assert found == [
        "upstream_model: only engine external takes one; llamacpp serves the model under its "
        "llmgw name"
    ]
    spaced = check_model(external("http://127.0.0.1:9000", upstream_model="gpt 4o"))
    assert spaced == ["profiles[0].upstream_model: 'gpt 4o' has spaces or control characters"]
    long = check_model(external("http://127.0.0.1:9000", upstream_model="m" * 257))
    assert long == ["profiles[0].upstream_model: at most 256 characters, not 257"]


def test_an_upstream_model_name_changes_the_fingerprint_only_when_set() -> None:
    plain = external("http://127.0.0.1:9000")
    assert "upstream_model" not in plain.profiles[0].fingerprint_fields()
    renamed = external("http://127.0.0.1:9000", upstream_model="gpt-4o-mini")
    assert renamed.fingerprints() != plain.fingerprints()


def test_changing_an_external_models_urls_changes_its_fingerprint() -> None:
    one = external("http://127.0.0.1:9000")
    assert one.fingerprints() == external("http://127.0.0.1:9000").fingerprints()
    assert one.fingerprints() != external("http://127.0.0.1:9001").fingerprints()


ARTIFACT = "sha256:" + "0f" * 32


def test_weights_from_the_mirror_need_no_path_on_a_node() -> None:
    whole = ModelSpec(
        name="m", artifact=ARTIFACT, engine="vllm", engine_version="0.32.0", memory_mb=4096
    )
    one_file = ModelSpec(name="m", artifact=ARTIFACT, weights="gguf/model.Q4.gguf", memory_mb=2048)
    assert check_model(whole) == check_model(one_file) == []
    # The artifact is part of what a running replica was started from: a new one rolls it.
    assert one_file.fingerprints() != one_file.model_copy(update={"artifact": ""}).fingerprints()
    # Its size is not (the digest names every file's size): recording it restarts nothing.
    sized = one_file.model_copy(update={"artifact_size": 5 << 30})
    assert sized.fingerprints() == one_file.fingerprints()
    assert check_model(sized) == []


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"artifact": "sha256:abc"}, "artifact: not a sha256 digest"),
        ({"artifact": "md5:" + "0" * 32}, "artifact: not a sha256 digest"),
        ({"artifact": ARTIFACT, "weights": "../model.gguf"}, "weights: with an artifact, a path"),
        ({"artifact": ARTIFACT, "weights": "/abs/model.gguf"}, "weights: with an artifact, a path"),
        ({"weights": "/w/m.gguf", "artifact_size": 1024}, "artifact_size: only with an artifact"),
    ],
)
def test_an_artifact_and_the_path_inside_it_are_checked(
    fields: dict[str, Any], expected: str
) -> None:
    problems = check_model(ModelSpec(name="m", **fields))
    assert any(p.startswith(expected) for p in problems), problems
