"""The environment one shard's processes get, beyond the engine's own (its adapter's
`environment`). Pure, and the same for every engine.

- CUDA_DEVICE_ORDER=PCI_BUS_ID, so CUDA numbers GPUs as nvidia-smi and placement do.
- CUDA_VISIBLE_DEVICES names the shard's GPUs by UUID (GPU-..., or MIG-... for a MIG
  instance), exactly as discovery stored them: indices shift when a card is added, removed or
  put in MIG mode, UUIDs do not. A shard without GPUs gets it empty: on a node with cards, a
  CPU replica (a CUDA build of llama.cpp, say) would otherwise take memory on cards placement
  gave to other replicas.
- On a multi-node shard, NCCL's environment for the replica's fabric on this node
  (engines/nccl_env.py): the adapters and interface are this node's own.
- The profile's env last, less what env_policy forbids: that is dropped and reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engines.nccl_env import FABRIC_KINDS, FabricKind, nccl_env
from workflows.contracts import NodeInventory
from workflows.env_policy import allowed_env


@dataclass(frozen=True)
class ShardEnv:
    env: dict[str, str]
    # name -> why it was dropped from the profile's env.
    dropped: dict[str, str] = field(default_factory=dict)


def fabric_kind(fabric: str, nodes: int) -> FabricKind | None:
    """The NCCL fabric of a replica's shards: None on one node (NCCL finds NVLink and PCIe
    itself there); sockets when a multi-node allocation names none."""
    if nodes <= 1:
        return None
    for kind in FABRIC_KINDS:
        if kind == fabric:
            return kind
    if not fabric:
        return "socket"
    raise ValueError(f"unknown fabric {fabric!r}")


def shard_env(
    *,
    gpu_uuids: list[str],
    profile_env: dict[str, str],
    nodes: int = 1,
    fabric: str = "",
    inventory: NodeInventory | None = None,
) -> ShardEnv:
    """What llmgw sets for this shard, then the profile's allowed env.

    Raises nccl_env.FabricUnavailableError (a ValueError) when a multi-node shard's node has
    no usable path on the fabric: launching anyway would hang rather than fail."""
    env = {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": ",".join(gpu_uuids),
    }
    kind = fabric_kind(fabric, nodes)
    if kind is not None:
        if inventory is None:
            raise ValueError("a multi-node shard needs this node's inventory for NCCL")
        env.update(nccl_env(inventory, kind))
    kept, dropped = allowed_env(profile_env)
    # The policy forbids every name set above, so the profile cannot take one over.
    return ShardEnv(env={**env, **kept}, dropped=dropped)
