"""Pure parsing of `nvidia-smi topo -m`: how GPUs reach each other and the RDMA adapters.

The matrix is what NCCL itself sees: NV# (a bonded set of # NVLinks), PIX/PXB (PCIe switches),
PHB (the host bridge), NODE (across host bridges in one NUMA node), SYS (across sockets).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from workflows.contracts import GpuInfo

# Closest first. NV# is GPU-to-GPU only, and always closer than any PCIe path.
_PCIE_RANK = {"X": 0, "PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5}
_NVLINK = re.compile(r"^NV(\d+)$")
_DEVICE = re.compile(r"^(GPU|NIC)(\d+)$")
_NIC_LEGEND = re.compile(r"^\s*(NIC\d+):\s*(\S+)\s*$")
# The most NVLinks any NVIDIA GPU has had (H100, B200: 18). Through an NVSwitch every peer sees
# all of a GPU's links; in a direct mesh the links are split among the peers, so their sum
# can never pass this.
MAX_NVLINKS_PER_GPU = 18
PCI_DEVICES = Path("/sys/bus/pci/devices")


@dataclass(frozen=True)
class Topology:
    gpus: list[str] = field(default_factory=list)  # "GPU0", ... in matrix order
    nics: list[str] = field(default_factory=list)  # "NIC0", ...
    # matrix[i][j]: GPU i to GPU j ("X", "NV18", "SYS", ...)
    matrix: list[list[str]] = field(default_factory=list)
    # gpu_nic[i][k]: GPU i to NIC k
    gpu_nic: list[list[str]] = field(default_factory=list)
    cpu_affinity: list[str] = field(default_factory=list)
    numa_affinity: list[int | None] = field(default_factory=list)
    nic_names: dict[str, str] = field(default_factory=dict)  # "NIC0" -> "mlx5_0"


def _int_or_none(value: str) -> int | None:
    return int(value) if value.isdigit() else None


def parse_topo_matrix(text: str) -> Topology:
    """The GPU rows of `nvidia-smi topo -m`, their NIC columns, affinities and the NIC legend.

    Cells are separated by tabs, but a copy often has spaces; the GPU and NIC columns are
    counted from the header, so either parses. The affinity columns that follow ("CPU
    Affinity", "NUMA Affinity", "GPU NUMA ID" on R535+) are read by position.
    """
    lines = text.splitlines()
    header_at = next(
        (i for i, line in enumerate(lines) if line.split() and line.split()[0] == "GPU0"),
        None,
    )
    if header_at is None:
        return Topology()
    columns = [c for c in lines[header_at].split() if _DEVICE.match(c)]
    gpus = [c for c in columns if c.startswith("GPU")]
    nics = [c for c in columns if c.startswith("NIC")]
    matrix: list[list[str]] = []
    gpu_nic: list[list[str]] = []
    cpu_affinity: list[str] = []
    numa_affinity: list[int | None] = []
    nic_names: dict[str, str] = {}
    for line in lines[header_at + 1 :]:
        legend = _NIC_LEGEND.match(line)
        if legend:
            nic_names[legend[1]] = legend[2]
            continue
        cells = line.split()
        if not cells or not cells[0].startswith("GPU") or cells[0] not in gpus:
            continue
        values = cells[1 : 1 + len(columns)]
        if len(values) < len(columns):
            continue
        rest = cells[1 + len(columns) :]
        matrix.append([values[columns.index(g)] for g in gpus])
        gpu_nic.append([values[columns.index(n)] for n in nics])
        cpu_affinity.append(rest[0] if rest else "")
        numa_affinity.append(_int_or_none(rest[1]) if len(rest) > 1 else None)
    return Topology(
        gpus=gpus,
        nics=nics,
        matrix=matrix,
        gpu_nic=gpu_nic,
        cpu_affinity=cpu_affinity,
        numa_affinity=numa_affinity,
        nic_names=nic_names,
    )


def nearest_nic(topology: Topology, gpu: int) -> str:
    """The RDMA device closest to GPU `gpu` ("mlx5_0"), or "" with none. Ties go to the lowest
    NIC number, which is how the matrix lists them and how NCCL breaks them too."""
    if gpu >= len(topology.gpu_nic):
        return ""
    best: tuple[int, int] | None = None
    for k, link in enumerate(topology.gpu_nic[gpu]):
        rank = _PCIE_RANK.get(link)
        if rank is not None and (best is None or rank < best[0]):
            best = (rank, k)
    if best is None:
        return ""
    nic = topology.nics[best[1]]
    return topology.nic_names.get(nic, nic)


def nvlink_count(link: str) -> int:
    match = _NVLINK.match(link)
    return int(match.group(1)) if match else 0


def has_nvswitch(topology: Topology) -> bool:
    """True when the GPUs meet through an NVSwitch (HGX 8-GPU boards, GB200 trays).

    Every pair must be NVLinked, and each GPU's links to its peers must add up to more than a
    GPU has: only a switch shows all of a GPU's links to every peer. A 4-GPU H100 mesh (NV6
    x 3 peers) or an NVLink bridge pair (NV4) is NVLink without a switch.
    """
    count = len(topology.matrix)
    if count < 2:
        return False
    for i, row in enumerate(topology.matrix):
        links = [nvlink_count(cell) for j, cell in enumerate(row) if j != i]
        if not links or min(links) == 0 or sum(links) <= MAX_NVLINKS_PER_GPU:
            return False
    return True


def attach_topology(gpus: list[GpuInfo], topology: Topology) -> list[GpuInfo]:
    """Each GPU with its NUMA node and nearest NIC; a MIG instance takes its card's."""
    attached: list[GpuInfo] = []
    for gpu in gpus:
        card = gpu.mig.parent_index if gpu.mig is not None else gpu.index
        update: dict[str, object] = {}
        if card < len(topology.numa_affinity) and topology.numa_affinity[card] is not None:
            update["numa_node"] = topology.numa_affinity[card]
        nic = nearest_nic(topology, card)
        if nic:
            update["nearest_nic"] = nic
        attached.append(gpu.model_copy(update=update) if update else gpu)
    return attached


def read_pci_numa_node(pci_bus_id: str, root: Path | str = PCI_DEVICES) -> int | None:
    """The NUMA node the kernel gives a PCI device; None where it says -1 (no affinity data).

    nvidia-smi writes the domain with 8 digits ("00000000:18:00.0"), sysfs with 4 in lower
    case ("0000:18:00.0").
    """
    domain, sep, rest = pci_bus_id.partition(":")
    if not sep:
        return None
    name = f"{domain[-4:]}:{rest}".lower()
    try:
        value = (Path(root) / name / "numa_node").read_text().strip()
    except OSError:
        return None
    return int(value) if value.isdigit() else None
