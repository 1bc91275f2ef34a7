"""The simulated fleet `llmgw bench placement` places onto: HGX H100 nodes as discovery reports
them, racks of NVLink domains, and a mix of replica shapes (vLLM on 1 to 16 GPUs, llama.cpp on
CPU). Pure: seeded by the caller's random.Random, so a run can be repeated."""

from __future__ import annotations

import random
from dataclasses import dataclass

from workflows.contracts import (
    Allocation,
    EngineState,
    EngineStatus,
    GpuFabric,
    GpuInfo,
    ImexInfo,
    NetworkPort,
    NodeInventory,
    NodeRecord,
    NodeState,
    PlacementRequest,
    Profile,
    ReplicaState,
    Route,
)
from workflows.names import replica_id, replica_workflow_id

GPUS_PER_NODE = 8
RACK_SIZE = 18  # nodes per NVLink domain (one rack)
H100 = "h100-80g"

# A Sapphire Rapids /proc/cpuinfo flags line, as discovery keeps it.
_CPU_FLAGS_LINE = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush dts acpi "
    "mmx fxsr sse sse2 ss ht tm pbe syscall nx pdpe1gb rdtscp lm constant_tsc art arch_perfmon "
    "pebs bts rep_good nopl xtopology nonstop_tsc cpuid aperfmperf tsc_known_freq pni "
    "pclmulqdq dtes64 monitor ds_cpl vmx smx est tm2 ssse3 sdbg fma cx16 xtpr pdcm pcid dca "
    "sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand lahf_lm "
    "abm 3dnowprefetch cpuid_fault epb cat_l3 cat_l2 cdp_l3 invpcid_single intel_ppin cdp_l2 "
    "ssbd mba ibrs ibpb stibp ibrs_enhanced tpr_shadow flexpriority ept vpid ept_ad fsgsbase "
    "tsc_adjust bmi1 avx2 smep bmi2 erms invpcid cqm rdt_a avx512f avx512dq rdseed adx smap "
    "avx512ifma clflushopt clwb intel_pt avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec "
    "xgetbv1 xsaves cqm_llc cqm_occup_llc cqm_mbm_total cqm_mbm_local split_lock_detect "
    "avx_vnni avx512_bf16 wbnoinvd dtherm ida arat pln pts hfi vnmi avx512vbmi umip pku ospke "
    "waitpkg avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg tme "
    "avx512_vpopcntdq la57 rdpid bus_lock_detect cldemote movdiri movdir64b enqcmd fsrm "
    "md_clear serialize tsxldtrk pconfig arch_lbr ibt amx_bf16 avx512_fp16 amx_tile amx_int8 "
    "flush_l1d arch_capabilities"
)
CPU_FLAGS = _CPU_FLAGS_LINE.split()

_IB_COUNTERS_LINE = (
    "port_rcv_data port_xmit_data port_rcv_packets port_xmit_packets port_rcv_errors "
    "port_xmit_discards symbol_error link_downed local_link_integrity_errors "
    "excessive_buffer_overrun_errors"
)
IB_COUNTERS = _IB_COUNTERS_LINE.split()


# --- the simulated fleet ------------------------------------------------------------------


def _uuid(rng: random.Random, prefix: str = "GPU-") -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"{prefix}{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def simulated_node(index: int, rng: random.Random) -> NodeRecord:
    """An HGX H100 node as discovery reports it: 8 GPUs in its rack's NVLink domain, two
    InfiniBand ports and a RoCE port, vLLM and llama.cpp installed. IMEX runs in every other
    rack, so only those racks' domains can carry a multi-node replica over NVLink."""
    name = f"gpu-{index:04d}"
    rack = index // RACK_SIZE
    cluster_uuid = _uuid(random.Random(rack), prefix="")
    gpus = [
        GpuInfo(
            index=i,
            uuid=_uuid(rng),
            name="NVIDIA H100 80GB HBM3",
            gpu_class=H100,
            memory_mb=81559,
            pci_bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0",
            memory_used_mb=rng.choice((0, 0, 0, 512)),
            compute_capability="9.0",
            numa_node=i // 4,
            nearest_nic=f"mlx5_{i // 4}",
            fabric=GpuFabric(
                state="Completed",
                status="Success",
                cluster_uuid=cluster_uuid,
                clique_id=1,
                bandwidth="Full",
            ),
        )
        for i in range(GPUS_PER_NODE)
    ]
    matrix = [["X" if a == b else "NV18" for b in range(GPUS_PER_NODE)] for a in range(8)]
    ports = [
        NetworkPort(
            device=f"mlx5_{p}",
            link_layer="InfiniBand",
            state="4: ACTIVE",
            phys_state="5: LinkUp",
            rate_gbps=400.0,
            counters={c: rng.randrange(10**12) for c in IB_COUNTERS},
        )
        for p in range(2)
    ]
    ports.append(
        NetworkPort(
            device="mlx5_2",
            link_layer="Ethernet",
            state="4: ACTIVE",
            phys_state="5: LinkUp",
            rate_gbps=200.0,
            netdev="ens2f0np0",
            roce_v2_gid_index=3,
            counters={c: rng.randrange(10**12) for c in IB_COUNTERS},
        )
    )
    imex_up = rack % 2 == 0
    inventory = NodeInventory(
        name=name,
        address=f"10.{rack // 250}.{rack % 250}.{index % RACK_SIZE + 10}",
        hostname=f"{name}.cluster.internal",
        machine_id=f"{rng.getrandbits(128):032x}",
        os="Ubuntu 22.04.4 LTS",
        kernel="5.15.0-107-generic",
        arch="x86_64",
        cpu_model="Intel(R) Xeon(R) Platinum 8480+",
        cpu_cores=224,
        cpu_flags=CPU_FLAGS,
        memory_mb=2_063_937,
        nvidia_driver="550.90.07",
        cuda_version="12.4",
        gpus=gpus,
        nvlink_matrix=matrix,
        nvswitch=True,
        network_ports=ports,
        management_interface="ens1f0",
        imex=ImexInfo(
            installed=True,
            running=imex_up,
            channels=[0] if imex_up else [],
            detail="" if imex_up else "nvidia-imex.service inactive",
        ),
    )
    verified = "2026-11-01T08:00:00"
    engines = {
        "vllm": EngineStatus(
            engine="vllm",
            version="0.6.3",
            state=EngineState.INSTALLED,
            path="/var/lib/llmgw/engines/vllm-0.6.3/bin/vllm",
            detail="0.6.3",
            verified_at=verified,
        ),
        "llamacpp": EngineStatus(
            engine="llamacpp",
            version="b4000",
            state=EngineState.INSTALLED,
            path="/var/lib/llmgw/engines/llamacpp-b4000/llama-server",
            detail="version: 4000 (a1b2c3d4)",
            verified_at=verified,
        ),
    }
    labels = {"rack": f"r{rack:03d}", "zone": f"z{rack % 4}", "gpu": H100}
    return NodeRecord(inventory=inventory, state=NodeState.READY, engines=engines, labels=labels)


@dataclass(frozen=True)
class Shape:
    """One kind of replica in the mix: a share of all replicas and its model's profiles."""

    label: str
    share: float
    profiles: tuple[Profile, ...]


def _vllm(gpus: int, nodes: int = 1) -> Profile:
    return Profile(
        engine="vllm",
        engine_version="0.6.3",
        gpu_class=H100,
        gpus_per_node=gpus,
        tensor_parallel=gpus,
        pipeline_parallel=nodes,
        nodes=nodes,
        cpu_cores=4 * gpus,
        memory_mb=32_768 * gpus,
        context_size=32_768,
        parallel=64,
        args=["--enable-prefix-caching", "--gpu-memory-utilization", "0.92"],
    )


def _llamacpp() -> Profile:
    return Profile(engine="llamacpp", cpu_cores=8, memory_mb=16_384, context_size=8192)


# 7,000 of the 8,000 GPUs of the default fleet; the 1-GPU models fall back to llama.cpp on CPU.
SHAPES = (
    Shape("vllm h100 x1", 0.45, (_vllm(1), _llamacpp())),
    Shape("vllm h100 x2", 0.25, (_vllm(2),)),
    Shape("vllm h100 x4", 0.10, (_vllm(4),)),
    Shape("vllm h100 x8", 0.03, (_vllm(8),)),
    Shape("vllm h100 x8 x2 nodes", 0.01, (_vllm(8, nodes=2),)),
    Shape("llamacpp cpu", 0.16, (_llamacpp(),)),
)
REPLICAS_PER_MODEL = 20


@dataclass(frozen=True)
class Replica:
    request: PlacementRequest
    shape: str


def replica_mix(count: int, rng: random.Random) -> list[Replica]:
    """`count` replicas in the SHAPES' shares, REPLICAS_PER_MODEL to a model, shuffled."""
    replicas: list[Replica] = []
    for n, shape in enumerate(SHAPES):
        want = round(count * shape.share) if n < len(SHAPES) - 1 else count - len(replicas)
        for k in range(want):
            model = f"{shape.label.replace(' ', '-')}-m{k // REPLICAS_PER_MODEL:03d}"
            index = k % REPLICAS_PER_MODEL
            req = PlacementRequest(
                replica_id=replica_id(model, index),
                workflow_id=replica_workflow_id(model, index),
                model=model,
                profiles=list(shape.profiles),
            )
            replicas.append(Replica(req, shape.label))
    rng.shuffle(replicas)
    return replicas


def route_for(alloc: Allocation, req: PlacementRequest) -> Route:
    """The route a replica workflow publishes once its engine serves."""
    profile = req.profiles[alloc.profile_index]
    fingerprint = f"{random.Random(req.model).getrandbits(64):016x}"
    return Route(
        replica_id=alloc.replica_id,
        model=alloc.model,
        node=alloc.node,
        endpoint=f"http://{alloc.address}:{alloc.port}",
        engine=profile.engine,
        state=ReplicaState.READY,
        fingerprint=fingerprint,
    )
