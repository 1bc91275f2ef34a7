"""The NVLink fabric and IMEX state the web console shows per tray and per node: the agent's
own exporter (activities/agent/node_metrics.fabric_families) read back by the CLI's parser
(workers/node_telemetry.py), and the console's view of it (workers/console_node.py), pure."""

from __future__ import annotations

from activities.agent.node_metrics import NodeReading, render
from workers.node_telemetry import parse_agent_metrics
from workflows.contracts import GpuFabric, GpuInfo, ImexInfo, NodeInventory

DOMAIN_UUID = "6f4c1f3e-8a7b-4d2e-9c51-2b7e0d4a9f13"


def tray(bandwidths: list[str], state: str = "Completed", imex: bool = True) -> NodeInventory:
    gpus = [
        GpuInfo(
            index=i,
            uuid=f"GPU-{i}",
            name="NVIDIA GB200",
            gpu_class="gb200-186g",
            memory_mb=189_471,
            fabric=GpuFabric(
                state=state if i == 0 else "Completed",
                status="Success",
                cluster_uuid=DOMAIN_UUID,
                clique_id=32766,
                bandwidth=b,
            ),
        )
        for i, b in enumerate(bandwidths)
    ]
    return NodeInventory(
        name="tray-1", gpus=gpus, imex=ImexInfo(installed=True, running=imex, channels=[0])
    )


def test_the_agents_fabric_metrics_are_read_back_per_gpu_and_imex_per_node() -> None:
    inventory = tray(["Full", "Degraded"], state="In Progress", imex=False)
    text = render("tray-1", NodeReading(inventory=inventory)).decode()
    telemetry = parse_agent_metrics(text, "tray-1")
    assert telemetry is not None
    first, second = telemetry.gpus
    assert (first.fabric_joined, first.fabric_degraded) == (False, False)
    assert (second.fabric_joined, second.fabric_degraded) == (True, True)
    assert (telemetry.imex_up, telemetry.imex_channels) == (False, 1)


def test_a_node_outside_any_fabric_reads_as_none() -> None:
    text = render("cpu", NodeReading(inventory=NodeInventory(name="cpu"))).decode()
    telemetry = parse_agent_metrics(text, "cpu")
    assert telemetry is not None
    assert (telemetry.imex_up, telemetry.imex_channels) == (None, None)
