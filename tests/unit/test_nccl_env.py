"""The NCCL environment a shard gets per fabric: only that fabric's active adapters."""

from __future__ import annotations

import pytest

from engines.nccl_env import FabricUnavailableError, available_fabrics, nccl_env
from workflows.contracts import GpuFabric, GpuInfo, NetworkPort, NodeInventory


def port(device: str, layer: str, state: str = "ACTIVE", gid: int | None = None) -> NetworkPort:
    return NetworkPort(device=device, link_layer=layer, state=state, roce_v2_gid_index=gid)


def node(ports: list[NetworkPort], domain: bool = False, iface: str = "bond0") -> NodeInventory:
    fabric = GpuFabric(
        state="Completed",
        status="Success",
        cluster_uuid="5f1e0a3c-9b7d-4e2a-8c61-2d4f0b9e7a13" if domain else "0" * 32,
        clique_id=1,
        bandwidth="Full",
    )
    gpus = [
        GpuInfo(
            index=i,
            uuid=f"GPU-{i}",
            name="NVIDIA GB200",
            gpu_class="gb200-186g",
            memory_mb=189471,
            fabric=fabric,
        )
        for i in range(4)
    ]
    return NodeInventory(name="n1", gpus=gpus, network_ports=ports, management_interface=iface)


# An IB fabric for GPUs, a RoCE fabric for storage, one IB port down.
MIXED = [
    port("mlx5_0", "InfiniBand"),
    port("mlx5_1", "InfiniBand"),
    port("mlx5_2", "InfiniBand", state="DOWN"),
    port("mlx5_10", "Ethernet", gid=3),
    port("mlx5_11", "Ethernet", gid=None),
]


def test_infiniband_lists_only_active_ib_adapters_exactly() -> None:
    env = nccl_env(node(MIXED), "infiniband")
    # "=" switches NCCL's prefix match off: "mlx5_1" alone would also pick mlx5_10 (RoCE).
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"
    assert "NCCL_IB_GID_INDEX" not in env
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["NCCL_SOCKET_IFNAME"] == "=bond0"
    assert env["GLOO_SOCKET_IFNAME"] == "bond0"
    assert "NCCL_MNNVL_ENABLE" not in env


def test_roce_lists_ports_with_a_v2_gid_and_gives_its_index() -> None:
    env = nccl_env(node(MIXED), "roce")
    assert env["NCCL_IB_HCA"] == "=mlx5_10:1"
    assert env["NCCL_IB_GID_INDEX"] == "3"


def test_roce_ports_at_another_gid_index_are_left_out() -> None:
    ports = [
        port("mlx5_0", "Ethernet", gid=3),
        port("mlx5_1", "Ethernet", gid=3),
        port("mlx5_2", "Ethernet", gid=5),
    ]
    env = nccl_env(node(ports), "roce")
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"
    assert env["NCCL_IB_GID_INDEX"] == "3"


def test_nvlink_domain_enables_mnnvl() -> None:
    env = nccl_env(node([], domain=True), "nvlink")
    assert env["NCCL_MNNVL_ENABLE"] == "1"
    assert "NCCL_IB_HCA" not in env


def test_socket_disables_ib() -> None:
    env = nccl_env(node(MIXED), "socket")
    assert env["NCCL_IB_DISABLE"] == "1"
    assert "NCCL_IB_HCA" not in env


def test_no_management_interface_leaves_socket_choice_unset() -> None:
    env = nccl_env(node([], iface=""), "socket")
    assert "NCCL_SOCKET_IFNAME" not in env
    assert "GLOO_SOCKET_IFNAME" not in env


@pytest.mark.parametrize(
    ("ports", "domain", "kind"),
    [
        ([port("mlx5_0", "InfiniBand", state="DOWN")], False, "infiniband"),
        ([port("mlx5_0", "Ethernet", gid=None)], False, "roce"),
        ([], False, "nvlink"),  # a single machine's NVSwitch is no domain
    ],
)
def test_a_fabric_the_node_cannot_use_is_refused(
    ports: list[NetworkPort], domain: bool, kind: str
) -> None:
    with pytest.raises(FabricUnavailableError):
        nccl_env(node(ports, domain=domain), kind)  # type: ignore[arg-type]


def test_available_fabrics_fastest_first() -> None:
    assert available_fabrics(node(MIXED, domain=True)) == [
        "nvlink",
        "infiniband",
        "roce",
        "socket",
    ]
    assert available_fabrics(NodeInventory(name="cpu")) == ["socket"]
