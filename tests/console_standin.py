"""A cluster for the web console's tests, built from the machine fixtures (tests/fixtures/
machines): a GB200 NVL72 rack of 18 trays (the recorded tray, named 18 times) with replicas
spanning trays, an A100 in MIG mode with a card nothing was carved on, and a cordoned CPU node
still installing its engine. One tray's GPU runs its NVLink at degraded bandwidth (as recorded),
one tray's GPU has not joined the domain, one tray's IMEX daemon is down; the fabric reaches the
console through the agent's own exporter. The engines' memory is measured, and the MIG node's
replica holds more than it reserved. The console reads it through the real pure code
(workers/console_data.py); only Temporal and the node agents are left out.

Given a directory, it also has a real mirror (deepseek's weights, a small stand-in file, held by
the trays running it and fetched by another) and an Ollama store holding `smollm2:135m`, which
the console imports through the real import code (workers/console_import.py); the definition
is recorded here instead of reaching a model workflow.

`python -m tests.console_standin` serves it on a gateway, for looking at the console by hand.
"""

from __future__ import annotations

import asyncio
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from activities.agent.gpu_parsing import (
    parse_compute_caps,
    parse_nvidia_smi_list,
    parse_nvidia_smi_xml,
)
from activities.agent.gpu_telemetry import GpuSample, parse_telemetry_xml
from activities.agent.node_metrics import NodeReading, render
from activities.control.mirror.add import record
from activities.control.mirror.ingest import ingest_stream
from activities.control.mirror.store import MirrorStore
from gateway.console.source import ConsoleRefused
from tests.machine_tools import MACHINES
from tests.ollama_kit import ollama_store
from workers.commands.mirror import mirror_entries
from workers.console_data import ClusterReadings, cluster_view
from workers.console_import import OllamaImports
from workers.fetch_progress import FetchStatus
from workers.node_telemetry import EngineFigures, GpuFigures, NodeTelemetry, parse_agent_metrics
from workflows.artifact_names import artifact_hint
from workflows.contracts import (
    Allocation,
    ArtifactFetchView,
    EngineState,
    EngineStatus,
    FetchProgressReport,
    GpuInfo,
    ImexInfo,
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
GIB = 1024 * MIB
# The fabric's faults, one tray each: the recorded degraded GPU 3 is kept on DEGRADED_TRAY only
# (the others run at full bandwidth), GPU 0 of UNJOINED_TRAY is still joining, and IMEX is down
# on IMEX_DOWN_TRAY.
DEGRADED_TRAY = RACK[4]
UNJOINED_TRAY = RACK[6]
IMEX_DOWN_TRAY = RACK[11]
# The Ollama model the console imports, and deepseek's weights in the mirror.
OLLAMA_MODEL = "smollm2:135m"
MIRRORED = "deepseek"
MIRRORED_SOURCE = "hf://deepseek-ai/DeepSeek-R1@stand-in"
WEIGHTS_FILE = "model-00001.safetensors"


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


def tray_gpus(tray: str) -> list[GpuInfo]:
    """The recorded tray's GPUs, with this tray's part of the fabric's faults."""
    gpus = fixture_gpus("gb200_nvl72_tray")
    for gpu in gpus:
        assert gpu.fabric is not None
        if gpu.fabric.bandwidth == "Degraded" and tray != DEGRADED_TRAY:
            gpu.fabric.bandwidth = "Full"
        if gpu.index == 0 and tray == UNJOINED_TRAY:
            gpu.fabric.state = "In Progress"
    return gpus


def _record(name: str, gpus: list[GpuInfo], **kw: Any) -> NodeRecord:
    installed = {"vllm": EngineStatus(engine="vllm", version="0.11.0", state=EngineState.INSTALLED)}
    inventory = NodeInventory(
        name=name,
        address=f"10.0.0.{len(name) + 10}",
        cpu_model="NVIDIA Grace" if name in RACK else "AMD EPYC 9354",
        cpu_cores=144 if gpus else 32,
        memory_mb=884_000 if gpus else 257_000,
        gpus=gpus,
        os="Ubuntu 24.04.1 LTS",
        kernel="6.8.0-1017-nvidia-64k" if name in RACK else "6.8.0-47-generic",
        arch="aarch64" if name in RACK else "x86_64",
        nvidia_driver="570.124.06" if gpus else None,
        cuda_version="12.8" if gpus else None,
        imex=ImexInfo(installed=True, running=name != IMEX_DOWN_TRAY, channels=[0])
        if name in RACK
        else None,
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
    fabric = fixture_gpus("gb200_nvl72_tray")[0].fabric
    domain = fabric.domain if fabric is not None else None
    assert domain is not None, "the tray fixture is in an NVLink domain"
    nodes = {name: _record(name, tray_gpus(name)) for name in RACK}
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


def with_fabric(telemetry: NodeTelemetry, record: NodeRecord) -> NodeTelemetry:
    """The fabric and IMEX figures the node's agent exports from its latest look, read back as
    the console reads an agent (workers/node_telemetry.py)."""
    name = record.inventory.name
    exported = parse_agent_metrics(
        render(name, NodeReading(inventory=record.inventory)).decode(), name
    )
    assert exported is not None
    joined = {g.index: g for g in exported.gpus}
    for gpu in telemetry.gpus:
        if gpu.index in joined:
            gpu.fabric_joined = joined[gpu.index].fabric_joined
            gpu.fabric_degraded = joined[gpu.index].fabric_degraded
    telemetry.imex_up, telemetry.imex_channels = exported.imex_up, exported.imex_channels
    return telemetry


# What each running engine holds, as its agent measures it: (resident memory, GPU memory) in
# bytes per shard. smol-0 holds more than the 4096 MiB placement reserved for it.
ENGINE_MEMORY = {
    "deepseek-0": (30 * GIB, 4 * 150 * GIB),
    "deepseek-1": (12 * GIB, 4 * 40 * GIB),
    "smol-0": (6 * GIB, 30 * GIB),
}
SMOL_OVER = "memory 6144 MiB used of 4096 MiB"


def engine_figures(ledger: LedgerState, node: str) -> list[EngineFigures]:
    found = []
    for replica, (rss, gpu) in ENGINE_MEMORY.items():
        allocation = ledger.allocations[replica]
        if node in {s.node for s in allocation.shards_or_leader()}:
            found.append(
                EngineFigures(replica, "vllm", True, 1.0, 0.0, 0.0, float(rss), float(gpu))
            )
    return found


def standin_fetches(manifest: str = "sha256:" + "ab" * 32) -> list[FetchStatus]:
    view = ArtifactFetchView(node=RACK[9], manifest=manifest, model="deepseek")
    report = FetchProgressReport(
        done=3_220_000_000, total=8_590_000_000, current="model-00002.safetensors", note="fetching"
    )
    hex_ = manifest.removeprefix("sha256:")
    return [FetchStatus(workflow_id=f"fetch:{RACK[9]}:{hex_}", view=view, report=report)]


def standin_mirror(root: Path) -> str:
    """A real mirror under `root` holding deepseek's weights (a small stand-in file, recorded
    as taken from the Hub); its digest."""
    store = MirrorStore(root / "mirror")
    store.ensure()
    data = b"stand-in weights " * 4096
    with store.adding():
        stored = ingest_stream(store, io.BytesIO(data), WEIGHTS_FILE, len(data))
        added = record(store, MIRRORED, MIRRORED_SOURCE, {WEIGHTS_FILE: stored})
    return added.digest


def standin_ollama(root: Path) -> Path:
    """An Ollama store holding OLLAMA_MODEL (a small stand-in GGUF: the import copies and
    verifies bytes, it does not load them)."""
    gguf = root / "smollm2.gguf"
    gguf.write_bytes(b"GGUF" + bytes(range(256)) * 2048)
    store = root / "ollama"
    ollama_store(store, gguf, {"num_ctx": 2048, "stop": ["<|im_end|>"]})
    return store


@dataclass
class StandinCluster:
    """The console's `ClusterConsole` over the stand-in cluster; commands change it as the
    node and model workflows would, and are kept for the tests to check. Given `state_dir`,
    it has a mirror and an Ollama store, and imports through the real import code."""

    state_dir: Path | None = None
    ledger: LedgerState = field(default_factory=standin_ledger)
    models: list[ModelView] = field(default_factory=standin_models)
    commands: list[tuple[str, str, Any]] = field(default_factory=list)
    imports: OllamaImports | None = None
    mirrored: str = "sha256:" + "ab" * 32  # deepseek's artifact

    def __post_init__(self) -> None:
        if self.state_dir is None:
            return
        self.mirrored = standin_mirror(self.state_dir)
        (deepseek,) = [m for m in self.models if m.spec.name == MIRRORED]
        deepseek.spec.artifact = self.mirrored
        for tray in RACK[0:4]:
            self.ledger.nodes[tray].inventory.artifacts = [artifact_hint(self.mirrored)]
        self.imports = OllamaImports(
            self.state_dir / "models",
            self.state_dir / "mirror",
            self._define,
            self._defined,
            str(standin_ollama(self.state_dir)),
        )

    async def _define(self, spec: ModelSpec) -> None:
        """Where the model workflow's `apply` would be sent."""
        self.commands.append(("define", spec.name, spec))
        self.models.append(ModelView(spec=spec, replica_ids=[]))

    async def _defined(self) -> set[str]:
        return {m.spec.name for m in self.models}

    async def read(self) -> dict[str, Any]:
        ledger = self.ledger
        telemetry: dict[str, NodeTelemetry | str] = {}
        for i, name in enumerate(RACK):
            tray = fixture_telemetry("gb200_nvl72_tray", name, 20.0 + 4 * i)
            tray.engines = engine_figures(ledger, name)
            telemetry[name] = with_fabric(tray, ledger.nodes[name])
        mig = fixture_telemetry("a100_80g_mig_3g40gb", MIG_NODE, 35.0)
        mig.engines = engine_figures(ledger, MIG_NODE)
        telemetry[MIG_NODE] = mig
        mirror = None
        if self.state_dir is not None:
            store = MirrorStore(self.state_dir / "mirror")
            mirror = await asyncio.to_thread(mirror_entries, store)
        readings = ClusterReadings(
            ledger=ledger,
            telemetry=telemetry,
            models=self.models,
            fetches=standin_fetches(self.mirrored),
            install_progress={(CPU_NODE, "llamacpp", "b6000"): "building llama-server 45%"},
            mirror=mirror,
            imports=self.imports.views() if self.imports is not None else [],
            temporal_ui=TEMPORAL_UI,
        )
        return cluster_view(readings).model_dump(mode="json")

    async def import_ollama(self, reference: str, name: str, mirror: bool) -> str:
        if self.imports is None:
            raise ConsoleRefused("this stand-in has no state dir to import into", status=404)
        return await self.imports.start(reference, name, mirror)

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
