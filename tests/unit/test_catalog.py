"""Catalog validation: what an operator gets told when a definition cannot run."""

import pytest
from pydantic import ValidationError

from workflows.catalog import check_model, check_profile
from workflows.contracts import ModelSpec, Profile


def problems(**fields) -> list[str]:
    return check_profile(Profile(**fields))


def test_the_demo_style_cpu_profile_is_fine():
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
def test_each_mistake_names_its_field(fields, expected):
    found = problems(**fields)
    assert any(p.startswith(expected) for p in found), found


@pytest.mark.parametrize(
    "name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "PATH", "PYTHONPATH", "BASH_ENV"]
)
def test_environment_that_changes_what_runs_is_refused(name):
    found = problems(engine="llamacpp", memory_mb=512, env={name: "x", "OMP_NUM_THREADS": "4"})
    assert [p.split(":")[0] for p in found] == [f"env.{name}"]


def test_a_multi_node_tensor_parallel_vllm_profile_adds_up():
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


def test_model_level_problems_name_the_profile_and_the_counts():
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


def test_a_flat_definition_from_before_profiles_is_one_profile():
    spec = ModelSpec.model_validate(
        {"name": "m", "weights": "/w", "engine": "llamacpp", "cpu_cores": 3, "memory_mb": 700}
    )
    assert len(spec.profiles) == 1
    assert (spec.profiles[0].cpu_cores, spec.profiles[0].memory_mb) == (3, 700)
    assert check_model(spec) == []


def test_profile_fingerprints_change_with_the_profile_only():
    spec = ModelSpec(name="m", weights="/w", profiles=[Profile(memory_mb=512)])
    scaled = spec.model_copy(update={"replicas": 9})
    assert spec.fingerprints() == scaled.fingerprints()
    changed = spec.model_copy(deep=True)
    changed.profiles[0].context_size = 8192
    assert spec.fingerprints() != changed.fingerprints()


def test_a_model_name_that_could_escape_a_path_is_refused():
    with pytest.raises(ValidationError):
        ModelSpec(name="../etc", weights="/w")
