"""A cluster for the web console's tests, built from the machine fixtures (tests/fixtures/
machines): a GB200 NVL72 rack of 18 trays (the recorded tray, named 18 times) with replicas
spanning trays, an A100 in MIG mode with a card nothing was carved on, and a cordoned CPU node
still installing its engine. The console reads it through the real pure code
(workers/console_data.py); only Temporal and the node agents are left out.

`python -m tests.console_standin` serves it on a gateway, for looking at the console by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from activities.agent.gpu_parsing import (
    parse_compute_caps,
    parse_nvidia_smi_list,
    parse_nvidia_smi_xml,
)
from activities.agent.gpu_telemetry import GpuSample, parse_telemetry_xml
from gateway.console.source import ConsoleRefused
from tests.machine_tools import MACHINES
from workers.console_data import ClusterReadings, cluster_view
from workers.fetch_progress import FetchStatus
from workers.node_telemetry import GpuFigures, NodeTelemetry
from workflows.contracts import (
    Allocation,
    ArtifactFetchView,
    EngineState,
    EngineStatus,
    FetchProgressReport,
    GpuInfo,
    LedgerState,
    ModelSpec,
    ModelView,
    NodeInventory,
    NodeRecord,
    NodeState,
    Profile,
    ReplicaState,
    Route,
    ShardAllocation,
)

RACK = [f"nvl72-tray-{n:02d}" for n in range(1, 19)]
MIG_NODE = "a100-mig"
CPU_NODE = "cpu-box"
TEMPORAL_UI = "http://127.0.0.1:8233"
MIB = 1024 * 1024


def fixture_gpus(machine: str) -> list[GpuInfo]:
    root = MACHINES / machine
    caps = root / "nvidia_smi_compute_cap.csv"
    return parse_nvidia_smi_xml(
        (root / "nvidia_smi_q_x.xml").read_text(),
        listed=parse_nvidia_smi_list((root / "nvidia_smi_L.txt").read_text()),
        compute_caps=parse_compute_caps(caps.read_text()) if caps.exists() else None,
    ).gpus


def fixture_telemetry(machine: str, node: str, busy: float) -> NodeTelemetry:
    """The machine's recorded telemetry, with each GPU's utilisation set to `busy` so the
    trays differ on the page."""
    samples = parse_telemetry_xml((MACHINES / machine / "nvidia_smi_q_x.xml").read_text())
    return NodeTelemetry(node, "nvidia-smi", [_figures(s, busy) for s in samples])


def _figures(sample: GpuSample, busy: float) -> GpuFigures:
    def mib(value: int | None) -> float | None:
        return value * MIB if value is not None else None

    return GpuFigures(
        index=sample.index,
        name=sample.name,
        parent=sample.parent,
        utilization_pct=busy,
        memory_used=mib(sample.memory_used_mb),
        memory_total=mib(sample.memory_total_mb),
        temperature_c=sample.temperature_c,
        power_w=sample.power_w,
        power_limit_w=sample.power_limit_w,
        ecc_uncorrected=sample.ecc_uncorrected,
        remap_pending=bool(sample.remap_pending),
        throttled=[name for name, on in sample.throttle.items() if on and name != "gpu_idle"],
    )


def _record(name: str, gpus: list[GpuInfo], **kw: Any) -> NodeRecord:
    installed = {"vllm": EngineStatus(engine="vllm", version="0.11.0", state=EngineState.INSTALLED)}
    inventory = NodeInventory(
        name=name,
        address=f"10.0.0.{len(name) + 10}",
        cpu_model="NVIDIA Grace" if name in RACK else "AMD EPYC 9354",
        cpu_cores=144 if gpus else 32,
        memory_mb=884_000 if gpus else 257_000,
        gpus=gpus,
    )
    return NodeRecord(inventory=inventory, state=NodeState.READY, engines=installed, **kw)


def _spanning(replica: str, model: str, trays: list[str], domain: str) -> Allocation:
    shards = [
        ShardAllocation(node=t, address="10.0.0.1", port=18000, rank=i, gpus=[0, 1, 2, 3])
        for i, t in enumerate(trays)
    ]
    return Allocation(
        replica_id=replica,
        workflow_id=f"replica:{model}:{replica.rsplit('-', 1)[1]}",
        model=model,
        node=trays[0],
        address="10.0.0.1",
        port=18000,
        cpu_cores=16,
        memory_mb=65536,
        shards=shards,
        fabric="nvlink",
        nvlink_domain=domain,
    )


def _route(replica: str, model: str, node: str, state: ReplicaState, detail: str = "") -> Route:
    return Route(
        replica_id=replica,
        model=model,
        node=node,
        endpoint="http://10.0.0.1:18000",
        engine="vllm",
        state=state,
        detail=detail,
    )


def standin_ledger() -> LedgerState:
    tray_gpus = fixture_gpus("gb200_nvl72_tray")
    fabric = tray_gpus[0].fabric
    domain = fabric.domain if fabric is not None else None
    assert domain is not None, "the tray fixture is in an NVLink domain"
    nodes = {name: _record(name, tray_gpus) for name in RACK}
    nodes[MIG_NODE] = _record(MIG_NODE, fixture_gpus("a100_80g_mig_3g40gb"))
    cpu = _record(CPU_NODE, [], cordoned=True, note="disk replacement")
    cpu.engines = {
        "llamacpp": EngineStatus(engine="llamacpp", version="b6000", state=EngineState.INSTALLING)
    }
    nodes[CPU_NODE] = cpu
    allocations = {
        "deepseek-0": _spanning("deepseek-0", "deepseek", RACK[0:4], domain),
        "deepseek-1": _spanning("deepseek-1", "deepseek", RACK[4:8], domain),
        "qwen-0": _spanning("qwen-0", "qwen", RACK[8:9], domain),
    }
    mig = Allocation(
        replica_id="smol-0",
        workflow_id="replica:smol:0",
        model="smol",
        node=MIG_NODE,
        address="10.0.0.18",
        port=18001,
        cpu_cores=2,
        memory_mb=4096,
        shards=[ShardAllocation(node=MIG_NODE, address="10.0.0.18", port=18001, gpus=[1001])],
    )
    allocations["smol-0"] = mig
    routes = {
        "deepseek-0": _route("deepseek-0", "deepseek", RACK[0], ReplicaState.READY),
        "deepseek-1": _route("deepseek-1", "deepseek", RACK[4], ReplicaState.LOADING),
        "qwen-0": _route("qwen-0", "qwen", RACK[8], ReplicaState.READY),
        "smol-0": _route("smol-0", "smol", MIG_NODE, ReplicaState.READY),
        "smol-1": _route(
            "smol-1", "smol", "", ReplicaState.PENDING, "no node has a free a100 MIG 3g.40gb"
        ),
    }
    return LedgerState(nodes=nodes, allocations=allocations, routes=routes, version=7)


def _model(name: str, profile: Profile, replicas: list[str], **kw: Any) -> ModelView:
    spec = ModelSpec(name=name, replicas=len(replicas), profiles=[profile])
    return ModelView(spec=spec, replica_ids=replicas, **kw)


def standin_models() -> list[ModelView]:
    gb200 = fixture_gpus("gb200_nvl72_tray")[0].gpu_class
    mig = next(g.gpu_class for g in fixture_gpus("a100_80g_mig_3g40gb") if g.mig is not None)
    return [
        _model(
            "deepseek",
            Profile(engine="vllm", gpu_class=gb200, gpus_per_node=4, nodes=4),
            ["deepseek-0", "deepseek-1"],
            stale=["deepseek-0"],
        ),
        _model("qwen", Profile(engine="vllm", gpu_class=gb200, gpus_per_node=4), ["qwen-0"]),
        _model(
            "smol", Profile(engine="vllm", gpu_class=mig, gpus_per_node=1), ["smol-0", "smol-1"]
        ),
    ]


def standin_fetches() -> list[FetchStatus]:
    view = ArtifactFetchView(node=RACK[9], manifest="sha256:" + "ab" * 32, model="deepseek")
    report = FetchProgressReport(
        done=3_220_000_000, total=8_590_000_000, current="model-00002.safetensors", note="fetching"
    )
    return [FetchStatus(workflow_id=f"fetch:{RACK[9]}:{'ab' * 32}", view=view, report=report)]


@dataclass
class StandinCluster:
    """The console's `ClusterConsole` over the stand-in cluster; commands change it as the
    node and model workflows would, and are kept for the tests to check."""

    ledger: LedgerState = field(default_factory=standin_ledger)
    models: list[ModelView] = field(default_factory=standin_models)
    commands: list[tuple[str, str, Any]] = field(default_factory=list)

    async def read(self) -> dict[str, Any]:
        telemetry: dict[str, NodeTelemetry | str] = {
            name: fixture_telemetry("gb200_nvl72_tray", name, 20.0 + 4 * i)
            for i, name in enumerate(RACK)
        }
        telemetry[MIG_NODE] = fixture_telemetry("a100_80g_mig_3g40gb", MIG_NODE, 35.0)
        readings = ClusterReadings(
            ledger=self.ledger,
            telemetry=telemetry,
            models=self.models,
            fetches=standin_fetches(),
            install_progress={(CPU_NODE, "llamacpp", "b6000"): "building llama-server 45%"},
            temporal_ui=TEMPORAL_UI,
        )
        return cluster_view(readings).model_dump(mode="json")

    async def node_command(self, node: str, action: str, reason: str) -> str:
        record = self.ledger.nodes.get(node)
        if record is None:
            raise ConsoleRefused(f"no node {node!r}", status=404)
        self.commands.append(("node", node, (action, reason)))
        record.cordoned = action != "uncordon"
        record.draining = action == "drain"
        record.note = reason if action != "uncordon" else ""
        return f"node {node}: {action} done"

    async def scale(self, model: str, replicas: int) -> str:
        for view in self.models:
            if view.spec.name == model:
                self.commands.append(("scale", model, replicas))
                view.spec.replicas = replicas
                return f"model {model}: {replicas} replica(s) wanted"
        raise ConsoleRefused(f"no model {model!r}", status=404)
