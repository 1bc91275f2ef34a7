"""Every engine is an adapter in the registry, and what an adapter says about its engine is what
the engine's own module (and the rest of llmgw) says."""

from dataclasses import replace
from pathlib import Path

import pytest

from activities.agent.readiness import HEALTH_THEN_MODELS
from engines import llamacpp, sglang, trtllm, vllm
from engines.adapter import InstallPlace, MetricNames, NotRunByLlmgwError, ShardLaunch
from engines.commands import Command, ShardPlace
from engines.external import External
from engines.key_guard import KEY_ENV
from engines.metrics import (
    DEFAULT_METRICS_PATH,
    KV_USAGE_METRICS,
    RUNNING_METRICS,
    WAITING_METRICS,
    metrics_path,
)
from engines.registry import ENGINES, UnknownEngineError, adapter, engines, find
from workflows.contracts import (
    EngineRequirement,
    EngineState,
    ModelSpec,
    Profile,
    engine_names,
    engines_where,
)
from workflows.placement.ports import ENGINE_INNER, KV_PUB, KV_REPLAY, extra_port_names

MODEL = ModelSpec(name="tiny", weights="/models/tiny")
PLACE = ShardPlace(address="10.0.0.1", port=18001, cpu_cores=3)


def launch(engine: str, binary: str, **profile: object) -> ShardLaunch:
    return ShardLaunch(
        replica_id="tiny-0",
        model=MODEL,
        profile=Profile.model_validate({"engine": engine, **profile}),
        place=PLACE,
        ports={},
        binary=Path(binary),
        key="k-1",
    )


def test_every_engine_the_catalog_accepts_has_an_adapter_under_its_name() -> None:
    assert sorted(ENGINES) == sorted(engine_names())
    for name in engine_names():
        assert adapter(name).name == name
    assert [e.name for e in engines()] == list(ENGINES)


def test_an_unknown_engine_is_a_clear_error() -> None:
    with pytest.raises(UnknownEngineError, match="unknown engine 'mystery': llmgw knows ") as err:
        adapter("mystery")
    assert isinstance(err.value, LookupError)
    assert err.value.name == "mystery"
    assert "external, llamacpp, sglang, trtllm, vllm" in str(err.value)
    # For callers that answer an unknown engine in their own words.
    assert find("mystery") is None
    assert find("vllm") is adapter("vllm")


def test_metric_names_and_paths_by_engine() -> None:
    assert {e.name: e.metrics for e in engines()} == {
        "llamacpp": MetricNames(
            "llamacpp:requests_processing", "llamacpp:requests_deferred", kv_usage=None
        ),
        "vllm": MetricNames(
            "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"
        ),
        "sglang": MetricNames(
            "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"
        ),
        "trtllm": MetricNames(
            "trtllm_num_requests_running",
            "trtllm_num_requests_waiting",
            "trtllm_kv_cache_utilization",
            path="/prometheus/metrics",
        ),
        "external": None,  # never scraped
    }
    # The parser's sets are the adapters' names, together.
    assert {
        "llamacpp:requests_processing",
        "vllm:num_requests_running",
        "sglang:num_running_reqs",
        "trtllm_num_requests_running",
    } == RUNNING_METRICS
    assert {
        "llamacpp:requests_deferred",
        "vllm:num_requests_waiting",
        "sglang:num_queue_reqs",
        "trtllm_num_requests_waiting",
    } == WAITING_METRICS
    assert {
        "vllm:kv_cache_usage_perc",
        "sglang:token_usage",
        "trtllm_kv_cache_utilization",
    } == KV_USAGE_METRICS
    assert metrics_path("external") == metrics_path("mystery") == DEFAULT_METRICS_PATH


def test_only_vllm_publishes_kv_events_as_the_catalog_and_placement_assume() -> None:
    publishing = {e.name for e in engines() if e.kv_events}
    assert publishing == set(engines_where(lambda row: row.kv_events)) == {"vllm"}
    for e in engines():
        names = extra_port_names(Profile(engine=e.name, kv_events=True), 0)
        assert (KV_PUB in names and KV_REPLAY in names) == e.kv_events


def test_only_vllm_loads_adapters_at_runtime_as_the_model_workflow_assumes() -> None:
    """The model tells a replica new adapters instead of replacing it only for these engines
    (their rows' lora_at_runtime); the agent then needs the engine's endpoints, and the engine
    the variable that turns them on."""
    loading = {e.name for e in engines() if e.runtime_adapters is not None}
    assert loading == set(engines_where(lambda row: row.lora_at_runtime)) == {"vllm"}
    vllm = find("vllm")
    assert vllm is not None
    assert vllm.runtime_adapters is not None
    runtime = vllm.runtime_adapters
    assert (runtime.load, runtime.unload) == ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")
    assert runtime.enable_env == ("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")


def test_every_engine_is_asked_the_same_readiness_questions_by_the_agent() -> None:
    # The agent cannot tell a shard's engine at wait_ready (its spec does not record it): an
    # adapter that declared other paths would need that first.
    assert {e.readiness for e in engines()} == {HEALTH_THEN_MODELS}


def test_only_llamacpp_has_a_default_version() -> None:
    assert {e.name: e.default_version for e in engines() if e.default_version} == {
        "llamacpp": llamacpp.LLAMACPP_DEFAULT_VERSION
    }


def test_llamacpp_adapter_uses_the_shards_cores_else_the_profiles() -> None:
    shard = launch("llamacpp", "/e/llama-server", cpu_cores=2, parallel=4)
    argv = llamacpp.command_line("/e/llama-server", MODEL, shard.profile, "10.0.0.1", 18001, 3)
    assert adapter("llamacpp").commands(shard) == [Command(argv)]
    unplaced = replace(shard, place=replace(PLACE, cpu_cores=0))
    (only,) = adapter("llamacpp").commands(unplaced)
    assert only.argv[only.argv.index("-t") + 1] == "2"
    assert adapter("llamacpp").environment(shard) == {"LLAMA_API_KEY": "k-1"}


def test_vllm_adapter_takes_kv_ports_by_name_and_runs_the_cpu_build_without_nvidia() -> None:
    shard = replace(
        launch("vllm", "/e/venv/bin/vllm", kv_events=True, gpu_class="l4-22g", gpus_per_node=1),
        ports={KV_PUB: 18002, KV_REPLAY: 18003},
        nvidia=True,
    )
    expected = vllm.launch_commands(
        "/e/venv/bin/vllm",
        MODEL,
        shard.profile,
        PLACE,
        cpu=False,
        kv_ports=(18002, 18003),
        kv_topic="tiny-0",
    )
    assert adapter("vllm").commands(shard) == expected
    env = adapter("vllm").environment(shard)
    assert env == vllm.engine_env("k-1", shard.profile, PLACE, cpu=False)
    assert env["VLLM_HOST_IP"] == "10.0.0.1"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env
    # The same GPU profile on a node without an NVIDIA driver: vLLM's CPU build.
    (cpu,) = adapter("vllm").commands(replace(shard, nvidia=False))
    assert "--enforce-eager" in cpu.argv
    assert "VLLM_CPU_KVCACHE_SPACE" in adapter("vllm").environment(replace(shard, nvidia=False))
    # A leader that publishes KV events without its ports is refused, not started half-way.
    with pytest.raises(ValueError, match="kv_events needs"):
        adapter("vllm").commands(replace(shard, ports={}))


@pytest.mark.parametrize(
    "binary",
    ["/e/venv/bin/python", "/e/venv/bin/sglang"],  # the install's, an operator's
)
def test_sglang_adapter_runs_the_environments_python(binary: str) -> None:
    shard = launch("sglang", binary, gpu_class="h100-80g", gpus_per_node=1)
    (only,) = adapter("sglang").commands(shard)
    assert only == Command(sglang.command_line("/e/venv/bin/python", MODEL, shard.profile, PLACE))
    assert adapter("sglang").environment(shard) == sglang.engine_env("k-1")


def test_trtllm_adapter_runs_trtllm_serve_beside_what_the_operator_named() -> None:
    shard = replace(
        launch("trtllm", "/t/bin/python", gpu_class="h100-80g", gpus_per_node=1),
        ports={ENGINE_INNER: 18002},
    )
    guard, serve = adapter("trtllm").commands(shard)
    assert guard.argv[2] == str(trtllm.KEY_GUARD)  # its key guard (tests/unit/test_trtllm_*)
    assert serve.argv[0] == "/t/bin/trtllm-serve"
    expected = trtllm.command_line("/t/bin/trtllm-serve", MODEL, shard.profile, PLACE, 18002)
    assert serve.argv == expected
    # trtllm-serve takes no key: its guard does.
    assert adapter("trtllm").environment(shard) == {KEY_ENV: "k-1"}


def test_external_is_known_but_never_installed_or_launched(tmp_path: Path) -> None:
    external = adapter("external")
    assert isinstance(external, External)
    assert not external.runs_on_nodes
    assert all(e.runs_on_nodes for e in engines() if e is not external)
    where = InstallPlace(tmp_path, tmp_path, nvidia=False)
    status = external.install(EngineRequirement(engine="external", version="1"), where, print)
    assert status.state is EngineState.FAILED
    assert "served outside llmgw" in status.detail
    assert not external.reverify(tmp_path, "1", where).ok
    shard = launch("llamacpp", "/x")
    with pytest.raises(NotRunByLlmgwError, match="served outside llmgw"):
        external.commands(shard)
    with pytest.raises(NotRunByLlmgwError):
        external.environment(shard)
