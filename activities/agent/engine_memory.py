"""What a running engine holds, measured: the resident memory of its process group (the
leader and the workers it forked) and the GPU memory its processes hold, for the agent's
metrics beside what placement reserved for it (`llmgw model resources`)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from activities.agent import procfs
from activities.agent.readiness import ComputeApp, parse_compute_apps, query_compute_apps
from activities.agent.shard_spec import ShardSpec


@dataclass(frozen=True)
class EngineMemory:
    rss_bytes: int
    # None: the shard has no GPUs. nvidia-smi failing reads as none held (0), as readiness reads it.
    gpu_memory_mb: int | None = None


def group_pids(leader: int) -> list[int]:
    """The engine's processes: its group, led by the pid in its spec (which may be gone)."""
    return sorted({leader, *procfs.group_members(leader)})


def measure(leader: int, gpu_uuids: Iterable[str], apps: list[ComputeApp] | None) -> EngineMemory:
    """The group's resident memory, and with GPUs (and nvidia-smi's compute apps) the memory its
    processes hold on the shard's GPUs."""
    pids = group_pids(leader)
    rss = sum(procfs.rss_bytes(pid) or 0 for pid in pids)
    uuids = set(gpu_uuids)
    if not uuids or apps is None:
        return EngineMemory(rss)
    held = sum(a.used_memory_mb for a in apps if a.pid in pids and a.gpu_uuid in uuids)
    return EngineMemory(rss, held)


# nvidia-smi's compute apps are read at most this often for the metrics (a process start
# each time, against the metrics loop's 2 s): GPU memory held moves slowly once loaded.
GPU_APPS_EVERY_S = 15.0


class EngineMemoryReader:
    """Each running engine's memory: resident memory at every reading, the GPU memory its
    processes hold from nvidia-smi read at most every GPU_APPS_EVERY_S, and only while some
    engine has GPUs."""

    def __init__(self) -> None:
        self._apps: list[ComputeApp] | None = None
        self._apps_read_at = -GPU_APPS_EVERY_S

    def measure_all(self, running: list[ShardSpec]) -> list[EngineMemory]:
        if not any(spec.gpu_uuids for spec in running):
            self._apps = None
        elif time.monotonic() - self._apps_read_at >= GPU_APPS_EVERY_S:
            self._apps = parse_compute_apps(query_compute_apps())
            self._apps_read_at = time.monotonic()
        return [measure(spec.pid, spec.gpu_uuids, self._apps) for spec in running]
