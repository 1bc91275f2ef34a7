"""A node's record as the fleet tables keep it: only what placement (workflows/placement/) and
`llmgw nodes` / `llmgw status` read. The node workflow keeps the full inventory; `llmgw node
show` reads it there. Every GPU's processes and every port's counters change all the time and
would make each refresh a write that placement must read again.
"""

from __future__ import annotations

from workflows.contracts import GpuInfo, NetworkPort, NodeInventory, NodeRecord

# The CPU flags anything reads from the tables' copy (`llmgw nodes` shows AVX2 or its absence);
# a node's full list (150 words on a current Xeon) stays in its node workflow.
KEPT_CPU_FLAGS = frozenset({"avx", "avx2", "avx512f", "avx512_bf16", "amx_tile", "f16c", "fma"})


def compact_gpu(gpu: GpuInfo) -> GpuInfo:
    """A GPU as placement sees it: class, memory, capability, fabric and whether it is usable.
    Dropped: processes and memory in use (they change all the time, and placement counts its
    own allocations), product name, PCI address, NUMA node, nearest NIC."""
    return GpuInfo(
        index=gpu.index,
        uuid=gpu.uuid,
        name="",
        gpu_class=gpu.gpu_class,
        memory_mb=gpu.memory_mb,
        compute_capability=gpu.compute_capability,
        ecc_uncorrected=gpu.ecc_uncorrected,
        mig=gpu.mig,
        fabric=gpu.fabric,
        unusable=gpu.unusable,
    )


def compact_port(port: NetworkPort) -> NetworkPort:
    """A port as fabric choice sees it (kind, active, RoCE v2 GID); no counters."""
    return NetworkPort(
        device=port.device,
        port=port.port,
        link_layer=port.link_layer,
        state=port.state,
        rate_gbps=port.rate_gbps,
        roce_v2_gid_index=port.roce_v2_gid_index,
    )


def compact_record(record: NodeRecord) -> NodeRecord:
    """The node as the fleet tables keep it. Placement decides the same on this as on the full
    record (tests/unit/test_ledger_compact.py holds it to that)."""
    inv = record.inventory
    inventory = NodeInventory(
        name=inv.name,
        address=inv.address,
        arch=inv.arch,
        cpu_cores=inv.cpu_cores,
        cpu_flags=[f for f in inv.cpu_flags if f in KEPT_CPU_FLAGS],
        memory_mb=inv.memory_mb,
        nvidia_driver=inv.nvidia_driver,
        cuda_version=inv.cuda_version,
        gpus=[compact_gpu(g) for g in inv.gpus],
        nvlink_matrix=inv.nvlink_matrix,
        nvswitch=inv.nvswitch,
        network_ports=[compact_port(p) for p in inv.network_ports],
        imex=inv.imex,
        problems=inv.problems,
        artifacts=inv.artifacts,
        artifact_disk_free_mb=inv.artifact_disk_free_mb,
        metrics_url=inv.metrics_url,
    )
    return record.model_copy(update={"inventory": inventory})
