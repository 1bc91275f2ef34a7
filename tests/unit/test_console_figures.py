"""The console's figures beyond the nodes and replicas, from hand-made data (no server, no
browser): the mirror's names with their models and nodes (workers/console_mirror.py), each
replica reserved against used and a tray's NVLink fabric (workers/console_node.py)."""

from __future__ import annotations

from tests.console_standin import (
    DEGRADED_TRAY,
    IMEX_DOWN_TRAY,
    MIG_NODE,
    RACK,
    SMOL_OVER,
    UNJOINED_TRAY,
    engine_figures,
    fixture_telemetry,
    standin_fetches,
    standin_ledger,
    standin_models,
    with_fabric,
)
from workers.commands.mirror import MirrorEntry
from workers.console_data import ClusterReadings, cluster_view
from workers.console_mirror import mirror_view
from workers.console_node import FROM_AGENT, FROM_INVENTORY, fabric_view, resource_views
from workers.node_telemetry import NodeTelemetry
from workflows.artifact_names import artifact_hint
from workflows.contracts import ArtifactFile, ArtifactManifest, LoraAdapter

WEIGHTS = "sha256:" + "1" * 64
ADAPTER = "sha256:" + "2" * 64
SHARED_BLOB = "sha256:" + "3" * 64


def manifest(*files: tuple[str, str, int]) -> ArtifactManifest:
    return ArtifactManifest(
        files=[ArtifactFile(path=p, digest=d, size=n) for p, d, n in files], source="hf://x/y"
    )


def test_each_mirror_name_says_its_size_models_and_the_nodes_holding_or_fetching_it() -> None:
    ledger = standin_ledger()
    models = standin_models()
    models[0].spec.artifact = WEIGHTS  # deepseek's weights
    lora = LoraAdapter(name="style", path="a.gguf", artifact=ADAPTER)
    models[1].spec.profiles[0].lora = [lora]  # qwen's adapter
    for tray in RACK[0:2]:
        ledger.nodes[tray].inventory.artifacts = [artifact_hint(WEIGHTS)]
    entries: list[MirrorEntry] = [
        ("deepseek", WEIGHTS, manifest(("a", SHARED_BLOB, 700), ("b", "sha256:" + "4" * 64, 300))),
        ("qwen.lora.style", ADAPTER, manifest(("a.gguf", SHARED_BLOB, 700))),
        ("broken", "sha256:" + "5" * 64, "manifest sha256:555 is not in the mirror"),
    ]
    view = mirror_view(entries, models, ledger.nodes, standin_fetches(WEIGHTS))
    by_name = {a.name: a for a in view.artifacts}
    assert [a.name for a in view.artifacts] == ["broken", "deepseek", "qwen.lora.style"]
    deepseek = by_name["deepseek"]
    assert (deepseek.size, deepseek.files, deepseek.models) == (1000, ["a", "b"], ["deepseek"])
    assert deepseek.held_on == RACK[0:2]
    assert deepseek.fetching_on == [RACK[9]]
    assert by_name["qwen.lora.style"].models == ["qwen"]
    assert by_name["qwen.lora.style"].held_on == []
    assert by_name["broken"].problem.endswith("is not in the mirror")
    assert by_name["broken"].size is None
    assert view.stored == 1000  # the blob both artifacts list is stored once
    assert view.here


def test_no_mirror_on_this_machine_is_said_not_shown_empty() -> None:
    view = mirror_view(None, standin_models(), standin_ledger().nodes, [])
    assert not view.here
    assert view.artifacts == []


def telemetry() -> dict[str, NodeTelemetry | str]:
    ledger = standin_ledger()
    found: dict[str, NodeTelemetry | str] = {}
    for name in (*RACK, MIG_NODE):
        machine = "a100_80g_mig_3g40gb" if name == MIG_NODE else "gb200_nvl72_tray"
        figures = fixture_telemetry(machine, name, 10.0)
        figures.engines = engine_figures(ledger, name)
        found[name] = with_fabric(figures, ledger.nodes[name]) if name in RACK else figures
    return found


def test_a_replica_using_more_than_it_reserved_is_flagged_and_one_not_running_says_so() -> None:
    rows = resource_views(standin_ledger(), telemetry())
    smol = next(r for r in rows if r.replica == "smol-0")
    assert smol.over == [SMOL_OVER]
    assert (smol.memory_used_mb, smol.memory_reserved_mb) == (6144, 4096)
    assert smol.gpu_used_mb == 30 * 1024
    assert smol.gpu_reserved_mb is not None
    deepseek = [r for r in rows if r.replica == "deepseek-0"]
    assert [r.node for r in deepseek] == RACK[0:4]
    assert all(r.over == [] and r.memory_used_mb == 30 * 1024 for r in deepseek)
    (qwen,) = [r for r in rows if r.replica == "qwen-0"]
    assert (qwen.memory_used_mb, qwen.over) == (None, [])
    assert qwen.unmeasured == "not running"


def test_each_tray_says_joined_degraded_or_not_joined_and_its_imex() -> None:
    ledger = standin_ledger()
    figures = telemetry()
    joined = fabric_view(ledger.nodes[RACK[0]], figures[RACK[0]])
    assert joined is not None
    assert (joined.state, joined.source) == ("joined", FROM_AGENT)
    assert (joined.imex_up, joined.imex_channels) == (True, 1)
    degraded = fabric_view(ledger.nodes[DEGRADED_TRAY], figures[DEGRADED_TRAY])
    assert degraded is not None
    assert (degraded.state, degraded.degraded) == ("degraded", [3])
    unjoined = fabric_view(ledger.nodes[UNJOINED_TRAY], figures[UNJOINED_TRAY])
    assert unjoined is not None
    assert (unjoined.state, unjoined.not_joined) == ("not joined", [0])
    # An agent not read: the node's record through the agent's own exporter.
    down = fabric_view(ledger.nodes[IMEX_DOWN_TRAY], "http://tray-12:8005/metrics: ConnectError")
    assert down is not None
    assert (down.source, down.state, down.imex_up) == (FROM_INVENTORY, "joined", False)
    # The MIG node: no GPU in a fabric, no IMEX.
    assert fabric_view(ledger.nodes[MIG_NODE], figures[MIG_NODE]) is None


def test_the_rack_carries_each_trays_fabric_and_each_gpu_its_own() -> None:
    view = cluster_view(ClusterReadings(ledger=standin_ledger(), telemetry=telemetry()))
    (domain,) = view.domains
    trays = {t.node: t for t in domain.trays}
    fabric = trays[DEGRADED_TRAY].fabric
    assert fabric is not None
    assert fabric.state == "degraded"
    gpus = {g.index: g for g in trays[DEGRADED_TRAY].gpus}
    assert (gpus[3].fabric_joined, gpus[3].fabric_degraded) == (True, True)
    assert gpus[0].fabric_degraded is False
    nodes = {n.name: n for n in view.nodes}
    assert nodes[RACK[0]].hardware.nvidia_driver == "570.124.06"
    assert [r.replica for r in view.resources if r.over] == ["smol-0"]
