"""Everything `llmgw doctor` concludes from: the node's inventory as discovery produced it, plus
what only the doctor looks at (kernel modules, the agent's memlock limit, the fabric manager,
the engines on disk). `--json` prints this whole model, so a machine nobody here can log into
can be diagnosed from what its operator sends back.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from workflows.contracts import NodeInventory

# Kernel modules the checks reason about. /proc/modules spells them with underscores.
MODULES_OF_INTEREST = (
    "nvidia",
    "nvidia_uvm",
    "nvidia_peermem",  # GPUDirect RDMA, shipped with the driver since 470
    "nv_peer_mem",  # its predecessor from Mellanox OFED
    "gdrdrv",  # GDRCopy: optional, lowers small-message latency
    "ib_core",
    "ib_uverbs",  # /dev/infiniband/uverbs*: without it NCCL cannot open any adapter
    "mlx5_ib",
    "mlx5_core",
    "rdma_ucm",
    "bnxt_re",
    "irdma",
    "efa",
)


class CommandProbe(BaseModel):
    """One command the doctor ran itself, and what came back."""

    command: str
    found: bool = False  # the binary is on PATH
    exit_code: int | None = None  # None: not run, or did not finish
    output: str = ""  # the tail of stdout and stderr


class MemlockLimit(BaseModel):
    """RLIMIT_MEMLOCK of the process that runs (or would run) the agent. Engines inherit it;
    NCCL over RDMA registers (pins) its buffers and fails or hangs under a finite limit."""

    soft_bytes: int | None = None  # None: unlimited
    hard_bytes: int | None = None
    # Whose limit this is, as a noun: "llmgw agent pid 4242", or the doctor's own shell when no
    # agent runs.
    source: str = ""

    @property
    def unlimited(self) -> bool:
        return self.soft_bytes is None


class EngineCheck(BaseModel):
    """An engine directory under the state dir (or an operator-named binary), and whether it
    runs here now."""

    engine: str
    version: str = ""
    path: str = ""
    # False: a directory without its install marker, a half-finished or failed install.
    marker: bool = True
    # None: an engine this llmgw has no adapter for, so no check.
    runnable: bool | None = None
    detail: str = ""


class DoctorFacts(BaseModel):
    inventory: NodeInventory
    # Modules of interest that are loaded (or built in). None: the list could not be read (a
    # container without /proc/modules), which is not the same as "none loaded".
    kernel_modules: list[str] | None = None
    nvidia_driver_loaded: bool = False  # /proc/driver/nvidia/version exists
    nvidia_smi: CommandProbe = Field(default_factory=lambda: CommandProbe(command="nvidia-smi"))
    memlock: MemlockLimit | None = None
    # `systemctl is-active nvidia-fabricmanager`: "active", "inactive", "failed", ...;
    # "unknown" without systemctl.
    fabric_manager: str = "unknown"
    # Card index -> persistence mode on, where nvidia-smi said.
    persistence_mode: dict[int, bool] = Field(default_factory=dict)
    engines: list[EngineCheck] = Field(default_factory=list)
    # Pids of engine processes llmgw itself started (their whole process groups): a GPU they
    # hold is in use by llmgw, not by a stranger.
    engine_pids: list[int] = Field(default_factory=list)
    # Where the engines were looked for.
    state_dir: str = ""

    def has_module(self, *names: str) -> bool:
        return self.kernel_modules is not None and any(n in self.kernel_modules for n in names)
