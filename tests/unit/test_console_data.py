"""The console's view of the cluster from hand-made readings (workers/console_data.py): no
server, no browser."""

from __future__ import annotations

from tests.console_standin import (
    CPU_NODE,
    MIG_NODE,
    RACK,
    fixture_telemetry,
    standin_fetches,
    standin_ledger,
    standin_models,
)
from workers.console_data import ClusterReadings, cluster_view
from workflows.contracts import EngineState


def readings() -> ClusterReadings:
    return ClusterReadings(
        ledger=standin_ledger(),
        telemetry={RACK[0]: fixture_telemetry("gb200_nvl72_tray", RACK[0], 50.0)},
        models=standin_models(),
        fetches=standin_fetches(),
        install_progress={(CPU_NODE, "llamacpp", "b6000"): "building 45%"},
    )


def test_a_replica_spanning_trays_shows_on_each_and_in_its_domain() -> None:
    view = cluster_view(readings())
    (domain,) = view.domains
    assert [t.node for t in domain.trays] == RACK
    assert domain.replicas == ["deepseek-0", "deepseek-1", "qwen-0"]
    nodes = {n.name: n for n in view.nodes}
    for tray in RACK[0:4]:
        assert {g.replica for g in nodes[tray].gpus} == {"deepseek-0"}
    assert {g.replica for g in nodes[RACK[9]].gpus} == {""}
    (deepseek0,) = [r for r in view.replicas if r.replica_id == "deepseek-0"]
    assert deepseek0.nodes == RACK[0:4]
    assert deepseek0.fabric == "nvlink"


def test_gpu_figures_join_the_inventory_and_missing_ones_say_why() -> None:
    nodes = {n.name: n for n in cluster_view(readings()).nodes}
    gpu = nodes[RACK[0]].gpus[0]
    assert gpu.utilization_pct == 50.0
    assert gpu.memory_used_mb is not None
    assert gpu.memory_used_mb <= gpu.memory_mb
    # No reading for the second tray: its GPUs are listed without figures, and why.
    assert nodes[RACK[1]].gpus[0].utilization_pct is None
    assert nodes[RACK[1]].telemetry_problem == "no reading"
    assert nodes[CPU_NODE].telemetry_problem == ""  # a CPU node has nothing to miss


def test_why_a_node_or_model_waits_is_in_words() -> None:
    view = cluster_view(readings())
    nodes = {n.name: n for n in view.nodes}
    assert nodes[RACK[0]].why_not_placeable == []
    assert "cordoned: disk replacement" in nodes[CPU_NODE].why_not_placeable
    assert any("no instances carved" in w for w in nodes[MIG_NODE].why_not_placeable)
    models = {m.name: m for m in view.models}
    assert models["smol"].why[-1] == "smol-1 is pending: no node has a free a100 MIG 3g.40gb"
    assert models["deepseek"].stale == ["deepseek-0"]
    (engine,) = nodes[CPU_NODE].engines
    assert engine.state == EngineState.INSTALLING.value
    assert engine.progress == "building 45%"
    assert engine.workflow_id == f"engine:{CPU_NODE}:llamacpp:b6000"
    # Progress belongs to an install under way: an installed engine shows none.
    assert all(e.progress == "" for e in nodes[RACK[0]].engines)


def test_a_fetch_shows_its_bytes_and_file() -> None:
    (fetch,) = cluster_view(readings()).fetches
    assert (fetch.done, fetch.total) == (3_220_000_000, 8_590_000_000)
    assert fetch.progress == "3.22 of 8.59 GB (37%)"
    assert fetch.detail == "fetching (model-00002.safetensors)"
