"""The agent's Prometheus metrics on loopback, fed from a machine fixture and stand-in engine
loads, and `llmgw nodes` reading its headline figures from them."""

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import workers.commands.node
from activities.agent.gpu_telemetry import TelemetryReading, parse_telemetry_xml
from activities.agent.node_metrics import (
    EngineLoadSample,
    NodeMetricsService,
    NodeReading,
    render,
)
from store.fleet import FleetTables
from tests.machine_tools import MACHINES
from workers.node_telemetry import gpu_headline, parse_agent_metrics, read_agents
from workflows.contracts import (
    EngineLoad,
    GpuFabric,
    GpuInfo,
    ImexInfo,
    NodeInventory,
    NodeRecord,
    NodeState,
)


def fixture_reading(machine: str) -> TelemetryReading:
    xml = (MACHINES / machine / "nvidia_smi_q_x.xml").read_text()
    return TelemetryReading(parse_telemetry_xml(xml), "nvidia-smi")


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(text: str, name: str, **labels: str) -> float:
    found = [
        v
        for (n, given), v in samples(text).items()
        if n == name and all(dict(given).get(k) == want for k, want in labels.items())
    ]
    assert len(found) == 1, (name, labels, found)
    return found[0]


LOADS = [
    EngineLoadSample(
        "chat-0", "vllm", EngineLoad(replica_id="chat-0", running=3, waiting=2, work=900)
    ),
    EngineLoadSample("chat-1", "llamacpp", EngineLoad(replica_id="chat-1", seen=False)),
]


def test_every_gpu_figure_and_engine_load_is_exported_with_the_node() -> None:
    reading = NodeReading(fixture_reading("ecc_uncorrected"), LOADS, read_at=100.0)
    text = render("gpu-a", reading).decode()
    assert value(text, "llmgw_node_info", node="gpu-a") == 1
    assert value(text, "llmgw_gpu_utilization_percent", gpu="1") == 0
    assert value(text, "llmgw_gpu_memory_total_bytes", gpu="1") == 81559 * 1024 * 1024
    assert value(text, "llmgw_gpu_temperature_celsius", gpu="1") == 33
    assert value(text, "llmgw_gpu_power_watts", gpu="1") == 71.52
    assert value(text, "llmgw_gpu_power_limit_watts", gpu="1") == 700
    assert value(text, "llmgw_gpu_ecc_errors", gpu="1", type="uncorrected") == 3
    assert value(text, "llmgw_gpu_ecc_errors", gpu="1", type="corrected") == 4
    assert value(text, "llmgw_gpu_remapped_rows", gpu="1", type="uncorrectable") == 1
    assert value(text, "llmgw_gpu_remap_pending", gpu="1") == 1
    assert value(text, "llmgw_node_engine_requests_running", replica="chat-0") == 3
    assert value(text, "llmgw_node_engine_requests_waiting", replica="chat-0") == 2
    assert value(text, "llmgw_node_engine_tokens_total", replica="chat-0") == 900
    assert value(text, "llmgw_node_engine_metrics_up", replica="chat-1", engine="llamacpp") == 0
    # An engine whose metrics could not be read has no load figures, not zeros.
    assert not [k for k in samples(text) if k[0].endswith("_running") and "chat-1" in str(k)]
    # N/A in the dump (retired pages on an H100) is left out rather than exported as 0.
    assert not [k for k in samples(text) if k[0] == "llmgw_gpu_retired_pages"]
    assert all(dict(labels).get("node") == "gpu-a" for _, labels in samples(text))


def test_mig_instances_are_their_own_series_under_their_card() -> None:
    text = render("mig", NodeReading(fixture_reading("a100_80g_mig_3g40gb"))).decode()
    assert value(text, "llmgw_gpu_memory_used_bytes", gpu="1000", parent="0") == 11891 * 2**20
    assert value(text, "llmgw_gpu_memory_used_bytes", gpu="0", parent="") == 13 * 2**20


def test_the_cli_reads_back_the_headline_figures() -> None:
    text = render("hgx", NodeReading(fixture_reading("h100_sxm_x8"))).decode()
    figures = parse_agent_metrics(text, "hgx")
    assert figures is not None
    assert figures.source == "nvidia-smi"
    assert len(figures.cards()) == 8
    # One card at 97% of eight: the mean is 12%; memory and power are the node's sums.
    assert gpu_headline(figures.cards()) == "util 12%, mem 70/637 GiB, 33 C, 572/5600 W"
    # Another node's agent answering at this URL is not this node's figures.
    assert parse_agent_metrics(text, "other") is None


@pytest.fixture
async def agent_metrics() -> AsyncIterator[NodeMetricsService]:
    async def engines() -> list[EngineLoadSample]:
        return LOADS

    service = NodeMetricsService(
        "gpu-a", engines, read_gpus=lambda: fixture_reading("ecc_uncorrected"), every_s=0.05
    )
    await service.start("127.0.0.1", 0)
    await service.read_once()
    try:
        yield service
    finally:
        await service.stop()


async def test_the_agent_serves_its_metrics_on_loopback(agent_metrics: NodeMetricsService) -> None:
    url = f"http://127.0.0.1:{agent_metrics.port}/metrics"
    async with httpx.AsyncClient() as client:
        response = await client.get(url)
    assert response.status_code == 200
    assert value(response.text, "llmgw_gpu_remap_pending", gpu="1") == 1
    assert value(response.text, "llmgw_node_info", telemetry_source="nvidia-smi") == 1


def _record(name: str, url: str, gpus: int = 2) -> NodeRecord:
    inventory = NodeInventory(
        name=name,
        cpu_cores=8,
        memory_mb=64000,
        metrics_url=url,
        gpus=[
            GpuInfo(index=i, uuid=f"GPU-{i}", name="H100", gpu_class="h100-80g", memory_mb=81559)
            for i in range(gpus)
        ],
    )
    return NodeRecord(state=NodeState.READY, inventory=inventory)


async def test_llmgw_nodes_shows_each_nodes_gpus_now(
    agent_metrics: NodeMetricsService,
    fleet: FleetTables,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"http://127.0.0.1:{agent_metrics.port}/metrics"
    await fleet.upsert_node(_record("gpu-a", url))
    # Its URL reaches gpu-a's agent: those are not its figures.
    await fleet.upsert_node(_record("gpu-b", url))
    await fleet.upsert_node(_record("cpu-c", "", gpus=0))

    async def no_engines(_client: Any, _record: NodeRecord) -> list[str]:
        return []

    monkeypatch.setattr(workers.commands.node, "engine_lines", no_engines)
    await workers.commands.node.show_nodes(None, fleet)  # type: ignore[arg-type]
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert "GPU NOW" in lines["NODE"]
    assert "util 0%, mem 0/159 GiB, 33 C, 143/1400 W" in lines["gpu-a"]
    assert " ? " in lines["gpu-b"]
    assert "GPU warnings:" in out
    assert "gpu-a: GPU 1: 3 uncorrected ECC errors" in out
    assert "gpu-a: GPU 1: a row remap waits for a GPU reset" in out
    assert "gpu-b: " in out.split("no GPU figures from:")[1]
    assert "cpu-c" not in out.split("no GPU figures from:")[1]


async def test_an_unreachable_agent_is_said_so() -> None:
    found = await read_agents({"far": "http://127.0.0.1:9/metrics", "none": ""})
    assert isinstance(found["far"], str)
    assert "127.0.0.1:9" in found["far"]
    assert found["none"] == "its agent serves no metrics (llmgw agent --metrics-port)"


def test_nvlink_fabric_and_imex_state_are_exported_from_the_latest_look() -> None:
    domain = "6c3a8b29-1f55-4c1e-9f0b-2a7d64e5c9d1"
    joined = GpuFabric(state="Completed", status="Success", cluster_uuid=domain, clique_id=3,
                       bandwidth="Full")  # fmt: skip
    degraded = GpuFabric(state="In Progress", status="", cluster_uuid=domain, clique_id=3,
                         bandwidth="Degraded")  # fmt: skip
    gpus = [
        GpuInfo(
            index=0, uuid="GPU-0", name="GB200", gpu_class="gb200-186g", memory_mb=1, fabric=joined
        ),
        GpuInfo(
            index=1,
            uuid="GPU-1",
            name="GB200",
            gpu_class="gb200-186g",
            memory_mb=1,
            fabric=degraded,
        ),
        GpuInfo(index=2, uuid="GPU-2", name="L40S", gpu_class="l40s-45g", memory_mb=1),
    ]
    imex = ImexInfo(installed=True, running=False, channels=[0, 1])
    inventory = NodeInventory(name="tray-1", gpus=gpus, imex=imex)
    text = render("tray-1", NodeReading(inventory=inventory)).decode()
    assert value(text, "llmgw_gpu_nvlink_fabric_joined", gpu="0", domain=f"{domain}/3") == 1
    assert value(text, "llmgw_gpu_nvlink_fabric_joined", gpu="1") == 0
    assert value(text, "llmgw_gpu_nvlink_fabric_degraded", gpu="0") == 0
    assert value(text, "llmgw_gpu_nvlink_fabric_degraded", gpu="1") == 1
    assert not [k for k in samples(text) if "fabric" in k[0] and ("gpu", "2") in k[1]]
    assert value(text, "llmgw_node_imex_up", node="tray-1") == 0
    assert value(text, "llmgw_node_imex_channels", node="tray-1") == 2
    # A machine without fabric GPUs or IMEX exports none of them.
    plain = NodeInventory(name="cpu-1")
    text = render("cpu-1", NodeReading(inventory=plain)).decode()
    assert not [k for k in samples(text) if "fabric" in k[0] or "imex" in k[0]]
