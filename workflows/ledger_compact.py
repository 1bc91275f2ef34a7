"""Keeping the ledger's state small enough to carry through continue-as-new.

The ledger carries its whole state into each new run as one payload, and Temporal refuses a
payload over 2 MB. At 1,000 eight-GPU nodes and 4,000 replicas the state as JSON is about 11 MB
(`llmgw bench placement` measures it), most of it node inventories: every GPU's processes and
PCI address, every port's counters, every CPU flag. Two things bring it down:

- compact_record(): the ledger keeps of a node only what placement (workflows/placement/) and
  `llmgw nodes` / `llmgw status` read. The node workflow keeps the full inventory; `llmgw node
  show` reads it there.
- pack_state() / unpack_state(): continue-as-new carries the state zlib-compressed. JSON of many
  alike records compresses about tenfold; placement never sees the packed form.

Pure functions: the ledger runs them (outside the workflow sandbox: workflows/ledger.py), and
replays them.
"""

from __future__ import annotations

import base64
import zlib

from pydantic import BaseModel, ConfigDict

from workflows.contracts import GpuInfo, LedgerState, NetworkPort, NodeInventory, NodeRecord

# The CPU flags anything reads from the ledger's copy (`llmgw nodes` shows AVX2 or its absence);
# a node's full list (150 words on a current Xeon) stays in its node workflow.
KEPT_CPU_FLAGS = frozenset({"avx", "avx2", "avx512f", "avx512_bf16", "amx_tile", "f16c", "fma"})
PACKED_ENCODING = "zlib+json/v1"
# zlib's level is part of the packed bytes: fixed, so a replay packs what the first run did.
_LEVEL = 6


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
    """The node as the ledger keeps it. Placement decides the same on this as on the full
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


class PackedLedgerState(BaseModel):
    """The ledger's state as continue-as-new carries it: compressed JSON, base64 (a payload is
    JSON, so bytes travel as text)."""

    # Refuse anything else, so a plain LedgerState is never taken for a packed one.
    model_config = ConfigDict(extra="forbid")

    encoding: str = PACKED_ENCODING
    packed: str
    # Uncompressed JSON bytes, for whoever reads the history.
    size: int = 0


def pack_state(state: LedgerState) -> PackedLedgerState:
    # Defaults left out: a field's name costs more than its value in most records, and
    # validation puts them back.
    raw = state.model_dump_json(exclude_defaults=True).encode()
    data = base64.b64encode(zlib.compress(raw, _LEVEL)).decode("ascii")
    return PackedLedgerState(packed=data, size=len(raw))


def unpack_state(packed: PackedLedgerState) -> LedgerState:
    if packed.encoding != PACKED_ENCODING:
        raise ValueError(f"unknown ledger state encoding {packed.encoding!r}")
    raw = zlib.decompress(base64.b64decode(packed.packed))
    return LedgerState.model_validate_json(raw)


def carried_state(state: LedgerState | PackedLedgerState | None) -> LedgerState:
    """What a ledger run starts from: nothing (a new cluster), a plain state (a run started
    before packing existed: its nodes are compacted here), or a packed one."""
    if state is None:
        return LedgerState(route_log_floor=0)
    if isinstance(state, PackedLedgerState):
        # Packed only by a ledger, which keeps its nodes compacted (upsert_node): compacting
        # them again would cost a second pass over every node in the run's first activation,
        # which Temporal's deadlock detector allows 2 seconds (1.7 s of 3.3 at 1,000 nodes on a
        # loaded machine).
        plain = unpack_state(state)
    else:
        plain = state
        plain.nodes = {name: compact_record(record) for name, record in plain.nodes.items()}
    if plain.route_log_floor is None:
        # A state from before the route log: nothing before this version is logged.
        plain.route_log_floor = plain.version
    return plain
