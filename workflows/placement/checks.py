"""Whether one node can take one profile's shard, and if not why, in the node's own words.

Nothing here trusts catalog validation: a profile that validation should have refused (a MIG
class with tensor parallelism, GPUs without a class) is refused here too, with the reason.
"""

from __future__ import annotations

from collections.abc import Collection

from workflows.contracts import EngineState, GpuInfo, NodeRecord, NodeState, Profile
from workflows.placement.disk import disk_problem
from workflows.placement.ports import free_ports, ports_per_shard
from workflows.placement.usage import NodeUsage

MIG_MARK = "-mig-"
# fp8 tensor cores arrived with Ada and Hopper (8.9, 9.0); an A100 (8.0) has none, and engines
# either refuse fp8 weights there or fall back to a slow path nobody asked for.
FP8_MIN_CAPABILITY = (8, 9)


def is_mig_class(gpu_class: str | None) -> bool:
    return gpu_class is not None and MIG_MARK in gpu_class


def gpu_label(index: int) -> str:
    """How views show a GPU: its card index, or card/migN for a MIG instance (1000+100c+i)."""
    if index >= 1000:
        card, instance = divmod(index - 1000, 100)
        return f"{card}/mig{instance}"
    return str(index)


def profile_label(profile: Profile) -> str:
    where = "cpu" if profile.gpu_class is None else f"{profile.gpu_class} x{profile.gpus_per_node}"
    if profile.nodes > 1:
        where += f" x{profile.nodes} nodes"
    return f"{profile.engine} {where}"


def profile_problem(profile: Profile) -> str | None:
    """Why no node at all can take this profile, whatever it has."""
    if profile.gpu_class is None:
        if profile.gpus_per_node:
            return f"{profile.gpus_per_node} GPUs per node wanted but no GPU class named"
        return None
    if profile.gpus_per_node < 1:
        return f"{profile.gpu_class} named but no GPUs per node wanted"
    shape = (
        profile.gpus_per_node,
        profile.tensor_parallel,
        profile.pipeline_parallel,
        profile.nodes,
    )
    if is_mig_class(profile.gpu_class) and shape != (1, 1, 1, 1):
        # A process opens one MIG device, and instances have no NVLink between them.
        return (
            f"{profile.gpu_class} is a MIG instance: a replica runs on exactly one, so "
            "gpus_per_node, tensor_parallel, pipeline_parallel and nodes must all be 1"
        )
    return None


def unusable_reason(gpu: GpuInfo) -> str:
    """Why a GPU must not be handed out, or "". ECC errors count even when discovery forgot
    to say so: a card corrupting memory corrupts the model."""
    if gpu.unusable:
        return gpu.unusable
    if gpu.ecc_uncorrected > 0:
        return f"{gpu.ecc_uncorrected} uncorrected ECC errors"
    return ""


def free_gpus(node: NodeRecord, gpu_class: str, used: set[int]) -> list[GpuInfo]:
    """Usable GPUs of the class that no shard holds, lowest index first."""
    return sorted(
        (
            g
            for g in node.inventory.gpus
            if g.gpu_class == gpu_class and g.index not in used and not unusable_reason(g)
        ),
        key=lambda g: g.index,
    )


def _capability(text: str) -> tuple[int, int] | None:
    major, _, minor = text.strip().partition(".")
    if not major.isdigit():
        return None
    return int(major), int(minor) if minor.isdigit() else 0


def engine_problem(node: NodeRecord, profile: Profile) -> str | None:
    engine = node.engines.get(profile.engine)
    if engine is None:
        return f"{profile.engine} is not installed"
    if engine.state != EngineState.INSTALLED:
        # UNAVAILABLE carries the plan's reason: "vllm unavailable: needs an NVIDIA GPU".
        detail = f": {engine.detail}" if engine.detail else ""
        return f"{profile.engine} {engine.state.value}{detail}"
    if profile.engine_version and engine.version != profile.engine_version:
        return f"{profile.engine} {engine.version} installed, {profile.engine_version} wanted"
    return None


def gpu_problem(node: NodeRecord, profile: Profile, used: set[int]) -> str | None:
    cls = profile.gpu_class
    if cls is None:
        return None
    of_class = [g for g in node.inventory.gpus if g.gpu_class == cls]
    if not of_class:
        return f"no {cls} GPUs"
    if profile.quantization.lower() == "fp8":
        for gpu in of_class:
            cap = _capability(gpu.compute_capability)
            if cap is not None and cap < FP8_MIN_CAPABILITY:
                return (
                    f"fp8 needs compute capability 8.9 or newer; {cls} is {gpu.compute_capability}"
                )
    # Counted, not listed: free_gpus sorts, and this runs for every node a placement checks.
    free = sum(1 for g in of_class if g.index not in used and not unusable_reason(g))
    if free >= profile.gpus_per_node:
        return None
    why = f"{free} of {len(of_class)} {cls} free, {profile.gpus_per_node} wanted"
    broken = [f"GPU {gpu_label(g.index)}: {r}" for g in of_class if (r := unusable_reason(g))]
    return f"{why} ({'; '.join(broken)})" if broken else why


def why_not(
    node: NodeRecord,
    profile: Profile,
    usage: NodeUsage,
    exclude: Collection[str] = (),
    busy_ports: Collection[int] = (),
    artifact: str = "",
    artifact_size: int = 0,
) -> str | None:
    """The reason this node cannot take one shard of the profile, or None when it can.
    `busy_ports`: ports here an agent found held by a process outside llmgw. `artifact`,
    `artifact_size`: the model's weights in the mirror, which a node not holding them must
    have the disk to fetch (disk.py)."""
    if node.state != NodeState.READY:
        return f"node is {node.state.value}"
    if node.cordoned or node.draining:
        why = "draining" if node.draining else "cordoned"
        return f"node is {why}" + (f" ({node.note})" if node.note else "")
    if node.inventory.name in exclude:
        return "excluded: moving away from this node"
    problem = (
        profile_problem(profile)
        or engine_problem(node, profile)
        or gpu_problem(node, profile, usage.gpus)
    )
    if problem:
        return problem
    free_cores = node.inventory.cpu_cores - usage.cpu_cores
    if free_cores < profile.cpu_cores:
        total = node.inventory.cpu_cores
        return f"{free_cores} of {total} CPU cores free, {profile.cpu_cores} wanted"
    free_memory = node.inventory.memory_mb - usage.memory_mb
    if free_memory < profile.memory_mb:
        return f"{free_memory} MB memory free, {profile.memory_mb} MB wanted"
    wanted = ports_per_shard(profile)
    if free_ports(node, usage.ports, wanted, busy_ports) is None:
        what = "no free engine port" if wanted == 1 else f"no {wanted} free engine ports"
        held = f" ({len(busy_ports)} held by other programs)" if busy_ports else ""
        return what + held
    return disk_problem(node, artifact, artifact_size)


def _linked(matrix: list[list[str]], a: int, b: int) -> bool:
    if a >= len(matrix) or b >= len(matrix[a]):
        return False
    return matrix[a][b].upper().startswith("NV")


def choose_gpus(node: NodeRecord, profile: Profile, used: set[int]) -> list[GpuInfo]:
    """The GPUs one shard gets: NVLink-connected to each other where the matrix says which
    are, else the lowest indices. Tensor parallelism over PCIe between cards on one node is
    several times slower than over NVLink, so a well-connected set is worth looking for."""
    assert profile.gpu_class is not None
    want = profile.gpus_per_node
    free = free_gpus(node, profile.gpu_class, used)
    assert len(free) >= want, "why_not said it fits"
    matrix = node.inventory.nvlink_matrix
    if want <= 1 or len(free) == want or not matrix or is_mig_class(profile.gpu_class):
        chosen = free[:want]
    else:
        # Greedy from each seed: add the GPU with the most links into the set so far, lowest
        # index on ties; keep the set with the most links, the lowest indices on ties.
        best: tuple[int, list[int]] | None = None
        indices = [g.index for g in free]
        for seed in indices:
            picked = [seed]
            while len(picked) < want:
                rest = [i for i in indices if i not in picked]
                nxt = max(rest, key=lambda i: (sum(_linked(matrix, i, p) for p in picked), -i))
                picked.append(nxt)
            picked.sort()
            links = sum(_linked(matrix, a, b) for a in picked for b in picked if a < b)
            if best is None or (-links, picked) < (-best[0], best[1]):
                best = (links, picked)
        assert best is not None
        by_index = {g.index: g for g in free}
        chosen = [by_index[i] for i in best[1]]
    # One tensor-parallel group never mixes GPU types: every card is the profile's class.
    assert all(g.gpu_class == profile.gpu_class for g in chosen)
    return chosen
