"""`nvidia-smi topo -m` by machine: NVLink matrix, NVSwitch, NUMA and nearest NIC per GPU."""

from pathlib import Path

from activities.agent.topology_parsing import (
    Topology,
    attach_topology,
    has_nvswitch,
    nearest_nic,
    parse_topo_matrix,
    read_pci_numa_node,
)
from workflows.contracts import GpuInfo, MigInstance

MACHINES = Path(__file__).resolve().parent.parent / "fixtures" / "machines"


def topo(machine: str) -> Topology:
    return parse_topo_matrix((MACHINES / machine / "nvidia_smi_topo_m.txt").read_text())


def test_h100_x8_is_all_nv18_through_an_nvswitch() -> None:
    t = topo("h100_sxm_x8")
    assert len(t.matrix) == 8
    assert all(t.matrix[i][j] == ("X" if i == j else "NV18") for i in range(8) for j in range(8))
    assert has_nvswitch(t)


def test_h100_x8_nearest_nic_and_numa_per_gpu() -> None:
    t = topo("h100_sxm_x8")
    assert [nearest_nic(t, i) for i in range(8)] == [f"mlx5_{i}" for i in range(8)]
    assert t.numa_affinity == [0, 0, 0, 0, 1, 1, 1, 1]
    assert t.cpu_affinity[4] == "52-103,156-207"


def test_gb200_tray_has_nvswitch_and_two_nics_per_grace() -> None:
    t = topo("gb200_nvl72_tray")
    assert has_nvswitch(t)
    assert [nearest_nic(t, i) for i in range(4)] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert t.numa_affinity == [0, 0, 1, 1]


def test_single_gpu_and_nvlink_pair_are_not_nvswitch() -> None:
    assert not has_nvswitch(topo("h200_x1"))
    assert not has_nvswitch(topo("l40s_x1"))
    # Two A100s linked NV12 could be a bridge or a switch; a pair never says which.
    assert not has_nvswitch(topo("a100_80g_mig_3g40gb"))
    assert nearest_nic(topo("h200_x1"), 0) == ""


def test_four_gpu_mesh_without_a_switch() -> None:
    # HGX H100 4-GPU: 18 links split over three peers.
    rows = "\n".join(
        f"GPU{i}\t" + "\t".join(" X " if i == j else "NV6" for j in range(4)) + "\t0-31\t0\t\tN/A"
        for i in range(4)
    )
    t = parse_topo_matrix(
        "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n" + rows
    )
    assert len(t.matrix) == 4
    assert not has_nvswitch(t)


def test_pcie_only_server_picks_the_closest_nic() -> None:
    text = (
        "        GPU0    GPU1    NIC0    NIC1    CPU Affinity    NUMA Affinity\n"
        "GPU0     X      SYS     SYS     PXB     0-23    0\n"
        "GPU1    SYS      X      PHB     SYS     24-47   1\n"
        "NIC0    SYS     PHB      X      SYS\n"
        "NIC1    PXB     SYS     SYS      X \n\n"
        "NIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_1\n"
    )
    t = parse_topo_matrix(text)
    assert [nearest_nic(t, 0), nearest_nic(t, 1)] == ["mlx5_1", "mlx5_0"]
    assert t.numa_affinity == [0, 1]
    assert not has_nvswitch(t)


def test_attach_topology_gives_mig_instances_their_cards_place() -> None:
    t = topo("h100_sxm_x8")
    card = GpuInfo(index=5, uuid="GPU-x", name="H100", gpu_class="h100-80g", memory_mb=1)
    instance = GpuInfo(
        index=1502,
        uuid="MIG-y",
        name="H100 MIG 1g.10gb",
        gpu_class="h100-80g-mig-1g.10gb",
        memory_mb=1,
        mig=MigInstance(parent_index=5, parent_uuid="GPU-x", profile="1g.10gb", gpu_instance_id=9),
    )
    attached = attach_topology([card, instance], t)
    assert [(g.numa_node, g.nearest_nic) for g in attached] == [(1, "mlx5_5"), (1, "mlx5_5")]


def test_pci_numa_node_from_sysfs(tmp_path: Path) -> None:
    (tmp_path / "0000:18:00.0").mkdir()
    (tmp_path / "0000:18:00.0" / "numa_node").write_text("1\n")
    (tmp_path / "0000:2a:00.0").mkdir()
    (tmp_path / "0000:2a:00.0" / "numa_node").write_text("-1\n")
    assert read_pci_numa_node("00000000:18:00.0", tmp_path) == 1
    assert read_pci_numa_node("00000000:2A:00.0", tmp_path) is None
    assert read_pci_numa_node("00000000:3A:00.0", tmp_path) is None
