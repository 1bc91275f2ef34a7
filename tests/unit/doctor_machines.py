"""Machines for the doctor's tests: NodeInventory objects shaped like the recorded fixtures
(h100_sxm_x8, gb200_nvl72_tray, roce_node, ...), and the doctor's own facts beside them."""

from __future__ import annotations

from activities.agent.doctor.facts import (
    CommandProbe,
    DoctorFacts,
    EngineCheck,
    MemlockLimit,
)
from workflows.contracts import (
    GpuFabric,
    GpuInfo,
    ImexInfo,
    NetworkPort,
    NodeInventory,
)

# Every kernel module the checks ask about: a machine given all of them shows only the findings
# its other facts lead to.
ALL_MODULES = [
    "gdrdrv",
    "ib_core",
    "ib_uverbs",
    "mlx5_core",
    "mlx5_ib",
    "nvidia",
    "nvidia_peermem",
    "nvidia_uvm",
    "rdma_ucm",
]
ZERO_UUID = "00000000-0000-0000-0000-000000000000"
NVL72_UUID = "5f1e0a3c-9b7d-4e2a-8c61-2d4f0b9e7a13"


# --- machines ------------------------------------------------------------------------------


def gpu(index: int, name: str = "NVIDIA H100 80GB HBM3", **extra: object) -> GpuInfo:
    fields: dict[str, object] = {
        "index": index,
        "uuid": f"GPU-{index:08x}-0000-0000-0000-000000000000",
        "name": name,
        "gpu_class": "h100-80g",
        "memory_mb": 81559,
    }
    fields.update(extra)
    return GpuInfo.model_validate(fields)


def ib_port(device: str, state: str = "ACTIVE", **extra: object) -> NetworkPort:
    fields: dict[str, object] = {
        "device": device,
        "link_layer": "InfiniBand",
        "state": state,
        "phys_state": "LinkUp",
        "rate_gbps": 400,
    }
    fields.update(extra)
    return NetworkPort.model_validate(fields)


def roce_port(device: str, netdev: str, gid: int | None) -> NetworkPort:
    return NetworkPort(
        device=device,
        link_layer="Ethernet",
        state="ACTIVE",
        phys_state="LinkUp",
        rate_gbps=200,
        netdev=netdev,
        roce_v2_gid_index=gid,
    )


def inventory(**fields: object) -> NodeInventory:
    base: dict[str, object] = {
        "name": "node-a",
        "address": "10.0.0.5",
        "arch": "x86_64",
        "cpu_model": "AMD EPYC 9654",
        "cpu_cores": 192,
        "cpu_flags": ["avx", "avx2", "avx512f", "fma"],
        "memory_mb": 1536 * 1024,
        "management_interface": "eno1",
    }
    base.update(fields)
    return NodeInventory.model_validate(base)


def llamacpp_ok() -> EngineCheck:
    return EngineCheck(
        engine="llamacpp",
        version="11434.0.0",
        path="/var/lib/llmgw/engines/llamacpp/11434.0.0/llama-server",
        runnable=True,
        detail="version: 11434 (abc1234)",
    )


def facts_for(inv: NodeInventory, **fields: object) -> DoctorFacts:
    gpu_node = bool(inv.gpus)
    base: dict[str, object] = {
        "inventory": inv,
        "kernel_modules": ALL_MODULES if gpu_node else ["ib_core"],
        "nvidia_driver_loaded": gpu_node,
        "nvidia_smi": CommandProbe(
            command="nvidia-smi -L",
            found=gpu_node,
            exit_code=0 if gpu_node else None,
        ),
        "memlock": MemlockLimit(source="llmgw agent pid 4242"),
        "fabric_manager": "active",
        "engines": [llamacpp_ok()],
        "state_dir": "/var/lib/llmgw",
    }
    base.update(fields)
    return DoctorFacts.model_validate(base)


def h100_sxm_x8(fabric_state: str = "Completed", status: str = "Success") -> NodeInventory:
    fabric = GpuFabric(state=fabric_state, status=status, cluster_uuid=ZERO_UUID, clique_id=0)
    return inventory(
        nvidia_driver="550.54.15",
        cuda_version="12.4",
        gpus=[gpu(i, pci_bus_id=f"0000:{i + 0x18:02x}:00.0", fabric=fabric) for i in range(8)],
        nvswitch=True,
        network_ports=[ib_port(f"mlx5_{i}") for i in range(8)],
    )


def gb200_tray(imex: ImexInfo | None, bandwidth: str = "Full") -> NodeInventory:
    fabric = GpuFabric(
        state="Completed",
        status="Success",
        cluster_uuid=NVL72_UUID,
        clique_id=32766,
        bandwidth=bandwidth,
    )
    return inventory(
        arch="aarch64",
        cpu_model="arm implementer 0x41 part 0xd4f",
        cpu_flags=["asimd"],
        nvidia_driver="570.124.06",
        cuda_version="12.8",
        gpus=[gpu(i, name="NVIDIA GB200", fabric=fabric) for i in range(4)],
        network_ports=[ib_port(f"mlx5_{i}") for i in range(4)],
        imex=imex,
    )


def cpu_node(**fields: object) -> NodeInventory:
    return inventory(cpu_cores=16, memory_mb=64 * 1024, **fields)
