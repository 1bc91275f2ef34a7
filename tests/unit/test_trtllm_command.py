"""A TensorRT-LLM shard as the agent launches it: the key guard on the shard's address and port,
then trtllm-serve on loopback at the inner port placement handed out, with its metrics switched
on by an options file that exists before it starts; the key in the guard's environment alone."""

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from activities.agent.launch_plan import LEGACY_PORT_OFFSETS, shard_ports
from engines import trtllm
from engines.adapter import ShardLaunch
from engines.commands import Command, ShardPlace
from engines.key_guard import KEY_ENV
from engines.registry import adapter
from tests.unit.placement_kit import h100s, installed, node, placed, req
from workflows.contracts import Allocation, LedgerState, ModelSpec, Profile
from workflows.placement.ports import ENGINE_INNER, extra_port_names, ports_per_shard

MODEL = ModelSpec(name="big", weights="/models/big")
PROFILE = Profile(engine="trtllm", gpu_class="h100-80g", gpus_per_node=2, tensor_parallel=2)
PLACE = ShardPlace(address="10.0.0.1", port=18001)
KEY = "llmgw-engine-0123abcd"


def launch(profile: Profile = PROFILE, **ports: int) -> ShardLaunch:
    return ShardLaunch(
        replica_id="big-0",
        model=MODEL,
        profile=profile,
        place=PLACE,
        ports=ports or {ENGINE_INNER: 18002},
        binary=Path("/t/bin/trtllm-serve"),
        key=KEY,
    )


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_guard_holds_the_shards_port_and_trtllm_serve_listens_on_loopback_behind_it() -> None:
    guard, serve = adapter("trtllm").commands(launch())
    assert guard == Command(
        [
            sys.executable,
            "-I",
            str(trtllm.KEY_GUARD),
            "--listen",
            "10.0.0.1:18001",
            "--upstream",
            "127.0.0.1:18002",
        ]
    )
    assert Path(guard.argv[2]).is_file()
    # trtllm-serve is the last command (the shard's exit is its own) and starts once the guard
    # listens; it is started without the key.
    assert serve.argv[:2] == ["/t/bin/trtllm-serve", "/models/big"]
    assert (flag(serve.argv, "--host"), flag(serve.argv, "--port")) == ("127.0.0.1", "18002")
    assert serve.wait_for == ("10.0.0.1", 18001)
    assert serve.env_drop == (KEY_ENV,)
    assert flag(serve.argv, "--tp_size") == "2"


def test_the_key_is_in_the_guards_environment_and_on_no_command_line() -> None:
    shard = launch()
    assert adapter("trtllm").environment(shard) == {KEY_ENV: KEY}
    for command in adapter("trtllm").commands(shard):
        assert not any(KEY in arg for arg in command.argv)


def test_an_ipv6_address_is_bracketed_for_the_guard() -> None:
    guard = trtllm.guard_command(ShardPlace(address="fd00::1", port=18001), 18002, "py")
    assert flag(guard, "--listen") == "[fd00::1]:18001"


def test_trtllm_serve_gets_the_options_file_that_switches_its_metrics_on() -> None:
    _, serve = adapter("trtllm").commands(launch())
    options = Path(flag(serve.argv, "--extra_llm_api_options"))
    assert options == trtllm.LLM_API_OPTIONS
    assert yaml.safe_load(options.read_text()) == {
        "return_perf_metrics": True,  # serves /prometheus/metrics
        "enable_iter_perf_stats": True,  # the running/waiting/KV gauges, on the PyTorch backend
    }
    metrics = adapter("trtllm").metrics
    assert metrics is not None
    assert metrics.path == "/prometheus/metrics"


@pytest.mark.parametrize("args", [["--backend", "tensorrt"], ["--backend=trt"]])
def test_the_tensorrt_backend_gets_options_it_knows(args: list[str]) -> None:
    # TrtLlmArgs forbids unknown fields, has no enable_iter_perf_stats and always collects them.
    _, serve = adapter("trtllm").commands(launch(PROFILE.model_copy(update={"args": args})))
    options = Path(flag(serve.argv, "--extra_llm_api_options"))
    assert options == trtllm.LLM_API_OPTIONS_TENSORRT
    assert yaml.safe_load(options.read_text()) == {"return_perf_metrics": True}


def test_the_option_files_ship_with_the_package() -> None:
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    shipped = pyproject.split("[tool.setuptools.package-data]", 1)[1]
    assert 'engines = ["trtllm_options*.yaml"]' in shipped
    for options in (trtllm.LLM_API_OPTIONS, trtllm.LLM_API_OPTIONS_TENSORRT):
        assert options.parent == Path(trtllm.__file__).resolve().parent
        assert options.match("trtllm_options*.yaml")


@pytest.mark.parametrize(
    "args",
    [["--extra_llm_api_options", "/mine.yaml"], ["--config=/mine.yaml"]],
)
def test_an_operators_own_options_file_is_refused_saying_why(args: list[str]) -> None:
    profile = PROFILE.model_copy(update={"args": args})
    with pytest.raises(ValueError, match="its own LLM API options file") as raised:
        adapter("trtllm").commands(launch(profile))
    assert "metrics" in str(raised.value)


def test_flags_llmgw_sets_are_refused_and_other_args_come_last() -> None:
    with pytest.raises(ValueError, match="llmgw sets them itself"):
        adapter("trtllm").commands(launch(PROFILE.model_copy(update={"args": ["--port", "1"]})))
    _, serve = adapter("trtllm").commands(
        launch(PROFILE.model_copy(update={"args": ["--kv_cache_free_gpu_memory_fraction", "0.8"]}))
    )
    assert serve.argv[-2:] == ["--kv_cache_free_gpu_memory_fraction", "0.8"]
    with pytest.raises(ValueError, match="one node"):
        trtllm.command_line("t", MODEL, PROFILE, ShardPlace(address="a", port=1, nodes=2), 2)


def test_a_shard_without_its_inner_port_is_refused() -> None:
    with pytest.raises(ValueError, match=ENGINE_INNER):
        adapter("trtllm").commands(replace(launch(), ports={}))


# --- ports ----------------------------------------------------------------------------------


def test_placement_hands_a_trtllm_leader_its_inner_port_from_the_nodes_range() -> None:
    assert extra_port_names(PROFILE, 0) == [ENGINE_INNER]
    assert ports_per_shard(PROFILE) == 2
    state = LedgerState(nodes={"a": node("a", 64, h100s(4), engines=installed("trtllm"))})
    alloc = placed(state, req("big-0", PROFILE))
    (leader,) = alloc.shards
    inner = leader.extra_ports[ENGINE_INNER]
    assert inner != leader.port
    assert state.nodes["a"].port_min <= inner <= state.nodes["a"].port_max
    ports = shard_ports(leader, leader, PROFILE, 0)
    assert ports.by_name == {ENGINE_INNER: inner}
    assert ports.binds == sorted([leader.port, inner])  # both checked free before the start
    # A second replica's ports are others.
    other = placed(state, req("big-1", PROFILE))
    taken = {leader.port, inner}
    assert not taken & {other.shards[0].port, *other.shards[0].extra_ports.values()}


def test_a_trtllm_allocation_from_before_the_inner_port_derives_it_from_the_http_port() -> None:
    old = Allocation(
        replica_id="big-0", node="a", address="a", port=18000, cpu_cores=1, memory_mb=1
    )
    (leader,) = old.shards_or_leader()
    assert shard_ports(leader, leader, PROFILE, 0).by_name == {
        ENGINE_INNER: 18000 + LEGACY_PORT_OFFSETS[ENGINE_INNER]
    }


def test_no_other_engine_gets_an_inner_port() -> None:
    for engine in ("llamacpp", "vllm", "sglang"):
        assert ENGINE_INNER not in extra_port_names(Profile(engine=engine), 0)
