"""The NCCL environment a shard gets on one fabric. Pure: the doctor shows it, a multi-node
launch sets it.

NCCL left to itself picks any adapter it can open. On a node with adapters on two fabrics (or a
RoCE port next to an InfiniBand one) it can pick one from which the peer is unreachable, and
the job then hangs instead of failing, so the chosen fabric's active adapters are listed
exactly ("=" turns NCCL's prefix match off: mlx5_1 would otherwise also match mlx5_10).
"""

from __future__ import annotations

from collections import Counter
from typing import Literal, get_args

from workflows.contracts import NetworkPort, NodeInventory

FabricKind = Literal["nvlink", "infiniband", "roce", "socket"]
FABRIC_KINDS: tuple[FabricKind, ...] = get_args(FabricKind)


class FabricUnavailableError(ValueError):
    """The node has no usable path on the fabric asked for."""


def nvlink_domain(inventory: NodeInventory) -> str | None:
    """The multi-node NVLink domain this node's GPUs have joined, if any."""
    for gpu in inventory.gpus:
        if gpu.fabric is not None and gpu.fabric.joined:
            return gpu.fabric.domain
    return None


def _active(inventory: NodeInventory, kind: str) -> list[NetworkPort]:
    return [p for p in inventory.network_ports if p.kind == kind and p.active]


def _roce_ports(inventory: NodeInventory) -> tuple[list[NetworkPort], int | None]:
    """Active RoCE ports with a v2 IPv4 GID, all at one GID index, and that index.

    NCCL_IB_GID_INDEX is one number for every adapter. Hosts normally agree, but a port whose
    v2 entry sits at another index would be given the wrong GID, so it is left out rather than
    listed with an index that does not route.
    """
    ports = [p for p in _active(inventory, "roce") if p.roce_v2_gid_index is not None]
    if not ports:
        return [], None
    counts = Counter(p.roce_v2_gid_index for p in ports)
    index = min(counts, key=lambda i: (-counts[i], i))
    return [p for p in ports if p.roce_v2_gid_index == index], index


def available_fabrics(inventory: NodeInventory) -> list[FabricKind]:
    """The fabrics a shard on this node could use, fastest first; sockets always."""
    fabrics: list[FabricKind] = []
    if nvlink_domain(inventory) is not None:
        fabrics.append("nvlink")
    if _active(inventory, "infiniband"):
        fabrics.append("infiniband")
    if _roce_ports(inventory)[0]:
        fabrics.append("roce")
    fabrics.append("socket")
    return fabrics


def _hca(ports: list[NetworkPort]) -> str:
    return "=" + ",".join(f"{p.device}:{p.port}" for p in ports)


def nccl_env(inventory: NodeInventory, fabric_kind: FabricKind) -> dict[str, str]:
    """The environment for a shard of a multi-node job over `fabric_kind` on this node.

    Raises FabricUnavailableError when the node has no usable path on that fabric: launching
    anyway would hang rather than fail.
    """
    # nvidia-smi numbers GPUs by PCI bus id, CUDA by its own speed guess; the same order keeps
    # CUDA_VISIBLE_DEVICES naming the cards placement chose.
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    if inventory.management_interface:
        # NCCL's bootstrap and Gloo go over the interface holding the node's own address, not
        # whichever one they find first (docker0 and link-local bridges are common culprits).
        env["NCCL_SOCKET_IFNAME"] = "=" + inventory.management_interface
        env["GLOO_SOCKET_IFNAME"] = inventory.management_interface
    if fabric_kind == "nvlink":
        if nvlink_domain(inventory) is None:
            raise FabricUnavailableError(f"node {inventory.name} is in no NVLink domain")
        env["NCCL_MNNVL_ENABLE"] = "1"
    elif fabric_kind == "infiniband":
        ports = _active(inventory, "infiniband")
        if not ports:
            raise FabricUnavailableError(f"node {inventory.name} has no active InfiniBand port")
        env["NCCL_IB_HCA"] = _hca(ports)
    elif fabric_kind == "roce":
        roce, index = _roce_ports(inventory)
        if not roce or index is None:
            raise FabricUnavailableError(
                f"node {inventory.name} has no active RoCE port with a RoCE v2 IPv4 GID"
            )
        env["NCCL_IB_HCA"] = _hca(roce)
        env["NCCL_IB_GID_INDEX"] = str(index)
    elif fabric_kind == "socket":
        # Otherwise NCCL would still try any RDMA adapter it finds before falling back.
        env["NCCL_IB_DISABLE"] = "1"
    else:
        raise FabricUnavailableError(f"unknown fabric kind {fabric_kind!r}")
    return env
