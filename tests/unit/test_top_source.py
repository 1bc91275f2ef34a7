"""`llmgw top`'s live source against real servers on loopback: the gateway (its admin API and
counters, a real SQLite store, a stand-in engine upstream) and a node agent's metrics
listener on a machine fixture, and the fleet tables the nodes and routes are read from."""

from datetime import UTC, datetime
from pathlib import Path

from activities.agent.gpu_telemetry import TelemetryReading, parse_telemetry_xml
from activities.agent.node_metrics import EngineLoadSample, NodeMetricsService
from store import KeyLimits, Store, UsageDelta
from store.fleet import FleetTables, open_fleet
from tests.gateway_kit import (
    MODEL,
    NODE,
    FakeRouteSource,
    recording_standin,
    route,
    running_gateway,
)
from tests.machine_tools import MACHINES
from workers.top.data import model_rates
from workers.top.source import LiveSource
from workflows.contracts import (
    EngineLoad,
    GpuInfo,
    NodeInventory,
    NodeRecord,
    NodeState,
)


async def test_the_live_source_reads_nodes_gpus_replicas_traffic_and_quotas(
    store: Store, fleet: FleetTables, tmp_path: Path
) -> None:
    xml = (MACHINES / "h200_x1" / "nvidia_smi_q_x.xml").read_text()

    async def engines() -> list[EngineLoadSample]:
        load = EngineLoad(replica_id=f"{MODEL}-0", running=2, waiting=1)
        return [EngineLoadSample(f"{MODEL}-0", "llamacpp", load)]

    agent = NodeMetricsService(
        NODE, engines, read_gpus=lambda: TelemetryReading(parse_telemetry_xml(xml), "nvml")
    )
    await agent.start("127.0.0.1", 0)
    await agent.read_once()
    async with recording_standin(tmp_path) as upstream:
        replica = route(f"{MODEL}-0", upstream.url)
        inventory = NodeInventory(
            name=NODE,
            metrics_url=f"http://127.0.0.1:{agent.port}/metrics",
            gpus=[GpuInfo(index=0, uuid="GPU-h", name="H200", gpu_class="h200-140g", memory_mb=1)],
        )
        await fleet.upsert_node(NodeRecord(inventory=inventory, state=NodeState.READY))
        await fleet.set_route(replica)
        async with running_gateway(store, FakeRouteSource(replica)) as gw:
            budgeted, _ = await store.create_key("team-a", limits=KeyLimits(token_budget=1000))
            today = datetime.now(UTC).date()
            await store.add_usage(
                [
                    UsageDelta(
                        key_id=budgeted.key_id,
                        model=MODEL,
                        day=today,
                        requests=4,
                        prompt_tokens=200,
                        completion_tokens=50,
                    )
                ]
            )
            source = LiveSource(None, fleet, gw.url)  # type: ignore[arg-type]
            first = await source.read()
            for _ in range(3):
                assert (await gw.chat()).status_code == 200
            second = await source.read()
        await agent.stop()

    assert second.problems == []
    (node,) = second.nodes
    (gpu,) = node.gpus
    assert gpu.name == "NVIDIA H200"
    assert gpu.memory_total == 143771 * 1024 * 1024
    (row,) = second.replicas
    assert (row.replica_id, row.running, row.waiting) == (f"{MODEL}-0", 2, 1)
    (rate,) = model_rates(second, first)
    assert rate.model == MODEL
    assert rate.requests_per_s is not None
    assert rate.requests_per_s > 0
    team = next(k for k in second.keys if k.name == "team-a")
    assert (team.requests_today, team.budget_spent, team.token_budget) == (4, 250, 1000)


async def test_what_cannot_be_read_is_named_and_the_rest_still_shown(tmp_path: Path) -> None:
    # A store nothing listens for: PostgreSQL on a closed port.
    unreachable = open_fleet("postgresql://llmgw@127.0.0.1:9/llmgw", tmp_path)
    try:
        source = LiveSource(None, unreachable, "http://127.0.0.1:9")  # type: ignore[arg-type]
        data = await source.read()
    finally:
        await unreachable.close()
    assert data.problems[0].startswith("store: ")
    assert data.problems[1].startswith("gateway admin API at http://127.0.0.1:9: ")
    assert data.nodes == []
