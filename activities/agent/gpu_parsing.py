"""Pure parsing of nvidia-smi output (`-q -x`, `-L`, `--query-gpu=index,compute_cap`) and the GPU
class names placement matches on.

nvidia-smi is the cgo-free, NVML-free path: it is on every machine with a driver and its XML
is stable across driver releases for the fields used here. Where the XML has no answer
(compute capability, MIG UUIDs and profiles) the small text outputs above fill it in; NVML
(nvml_source.py) fills whatever is still missing.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from workflows.contracts import GpuFabric, GpuInfo, GpuProcess, MigInstance

# Words that name the vendor or the board's form factor and memory type: two boards of one
# chip with the same memory serve the same models, so they share a class.
_DROPPED_WORDS = frozenset(
    {
        "nvidia",
        "geforce",
        "tesla",
        "quadro",
        "sxm",
        "sxm2",
        "sxm3",
        "sxm4",
        "sxm5",
        "pcie",
        "hbm2",
        "hbm2e",
        "hbm3",
        "hbm3e",
    }
)
# The marketing memory size ("80GB"): the class carries the driver's own figure instead.
_MARKETING_SIZE = re.compile(r"^\d+gb$")
_MIB_VALUE = re.compile(r"^\s*(\d+)\s*MiB\s*$")
# MIG instances are numbered past any real card index so the two never collide.
MIG_INDEX_BASE = 1000
MIG_INDEX_PER_CARD = 100
NO_INSTANCES_CARVED = "MIG mode on with no instances carved"

# `nvidia-smi -L`: "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-...)" and, under a card in MIG mode,
# "  MIG 3g.40gb     Device  0: (UUID: MIG-...)". Drivers before R470 named instances
# "MIG-GPU-<card uuid>/<gi>/<ci>"; both forms are taken as they are.
_LIST_GPU = re.compile(r"^GPU\s+(\d+):\s+(.*?)\s+\(UUID:\s*(GPU-[^)\s]+)\)\s*$")
_LIST_MIG = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s+\(UUID:\s*(MIG-[^)\s]+)\)\s*$")


@dataclass(frozen=True)
class CardReport:
    """One physical card as nvidia-smi lists it, whatever placement gets from it: the doctor
    reports MIG modes per card, which the GpuInfo list (instances, not cards) cannot show."""

    index: int
    uuid: str
    name: str
    gpu_class: str
    pci_bus_id: str
    mig_current: str  # "Enabled", "Disabled", or "" where the card has no MIG at all
    mig_pending: str
    mig_instances: int = 0


@dataclass(frozen=True)
class NvidiaSmiReport:
    driver_version: str | None
    cuda_version: str | None
    gpus: list[GpuInfo] = field(default_factory=list)
    cards: list[CardReport] = field(default_factory=list)


@dataclass(frozen=True)
class ListedMig:
    device: int  # "Device N" in `nvidia-smi -L`: the <mig_device><index> of `-q -x`
    profile: str  # "3g.40gb"
    uuid: str


@dataclass(frozen=True)
class ListedGpu:
    index: int
    name: str
    uuid: str
    migs: list[ListedMig] = field(default_factory=list)


def gpu_class(product_name: str, memory_mib: int) -> str:
    """A stable class such as "h100-80g" from the product name and the memory the driver reports.

    The size is the driver's MiB rounded to GiB, not the marketing name: an L40S sold as 48GB
    reports 46068 MiB (44.99 GiB) and is "l40s-45g". That number decides whether a model fits,
    so it must be what the card really has.
    """
    words = [w for w in re.split(r"[\s\-_/]+", product_name.lower()) if w]
    kept = [w for w in words if w not in _DROPPED_WORDS and not _MARKETING_SIZE.match(w)]
    name = "-".join(kept) or "gpu"
    gib = round(memory_mib / 1024)
    return f"{name}-{gib}g"


def mig_class(card_class: str, profile: str) -> str:
    """ "a100-80g-mig-3g.40gb": the card's class, so a model sized for the card is never matched
    to a slice of it, and the profile, which fixes the slice's memory and compute."""
    return f"{card_class}-mig-{profile}"


def mig_index(card: int, device: int) -> int:
    return MIG_INDEX_BASE + MIG_INDEX_PER_CARD * card + device


def parse_nvidia_smi_list(text: str) -> list[ListedGpu]:
    """Cards and their MIG instances from `nvidia-smi -L`, in the order listed."""
    cards: list[ListedGpu] = []
    for line in text.splitlines():
        card = _LIST_GPU.match(line)
        if card:
            cards.append(ListedGpu(index=int(card[1]), name=card[2], uuid=card[3]))
            continue
        mig = _LIST_MIG.match(line)
        if mig and cards:
            cards[-1].migs.append(ListedMig(device=int(mig[2]), profile=mig[1], uuid=mig[3]))
    return cards


def parse_compute_caps(text: str) -> dict[int, str]:
    """`nvidia-smi --query-gpu=index,compute_cap --format=csv,noheader`: "0, 9.0" per line.

    The `-q -x` XML has no compute capability; this query (driver R510 and later) is the
    nvidia-smi way to get it, so a machine without NVML's Python binding still reports it.
    """
    caps: dict[int, str] = {}
    for line in text.splitlines():
        index, sep, cap = line.partition(",")
        index, cap = index.strip(), cap.strip()
        if sep and index.isdigit() and re.fullmatch(r"\d+\.\d+", cap):
            caps[int(index)] = cap
    return caps


def _text(node: ET.Element | None, path: str) -> str:
    if node is None:
        return ""
    found = node.find(path)
    if found is None or found.text is None:
        return ""
    return found.text.strip()


def _known(value: str) -> str | None:
    return None if value in ("", "N/A") else value


def _mib(value: str) -> int:
    match = _MIB_VALUE.match(value)
    return int(match.group(1)) if match else 0


def _count(value: str) -> int:
    return int(value) if value.isdigit() else 0


def _strip_doctype(text: str) -> str:
    # nvidia-smi names an external DTD it never ships; ElementTree would ignore it, but an
    # internal subset could declare entities, and a discovery parser has no use for either.
    if "<!ENTITY" in text:
        raise ValueError("nvidia-smi XML declares entities; refusing to parse it")
    return re.sub(r"<!DOCTYPE[^>]*>", "", text, count=1)


def _uncorrected_ecc(gpu: ET.Element) -> int:
    """Volatile (since the driver loaded) uncorrectable errors, DRAM and SRAM together.

    R535 and later split SRAM into parity and SEC-DED; earlier R5xx drivers had one
    sram_uncorrectable; pre-R510 drivers said double_bit/total. Whichever is there is summed.
    """
    volatile = gpu.find("ecc_errors/volatile")
    if volatile is None:
        return 0
    names = (
        "dram_uncorrectable",
        "sram_uncorrectable",
        "sram_uncorrectable_parity",
        "sram_uncorrectable_secded",
    )
    total = sum(_count(_text(volatile, name)) for name in names)
    return total or _count(_text(volatile, "double_bit/total"))


def _fabric(gpu: ET.Element) -> GpuFabric | None:
    """The <fabric> block (R550 and later). All N/A on cards that join no fabric: None then."""
    node = gpu.find("fabric")
    if node is None:
        return None
    state = _known(_text(node, "state"))
    if state is None:
        return None
    clique = _text(node, "cliqueId")
    return GpuFabric(
        state=state,
        status=_known(_text(node, "status")) or "",
        cluster_uuid=_known(_text(node, "clusterUuid")) or "",
        clique_id=int(clique) if clique.isdigit() else None,
        bandwidth=_known(_text(node, "health/bandwidth")) or "",
    )


def _processes(gpu: ET.Element) -> list[tuple[str, str, GpuProcess]]:
    """Each process with the (GPU instance, compute instance) it runs in; N/A outside MIG."""
    found: list[tuple[str, str, GpuProcess]] = []
    for info in gpu.findall("processes/process_info"):
        pid = _text(info, "pid")
        if not pid.isdigit():
            continue
        process = GpuProcess(
            pid=int(pid),
            name=_text(info, "process_name"),
            used_memory_mb=_mib(_text(info, "used_memory")),
        )
        found.append((_text(info, "gpu_instance_id"), _text(info, "compute_instance_id"), process))
    return found


def _ecc_unusable(count: int) -> str:
    return f"{count} uncorrected ECC errors since the driver loaded" if count else ""


def _mig_instances(
    gpu: ET.Element, card: GpuInfo, listed: ListedGpu | None, ecc: int
) -> list[GpuInfo]:
    by_device = {m.device: m for m in listed.migs} if listed else {}
    processes = _processes(gpu)
    instances: list[GpuInfo] = []
    for mig in gpu.findall("mig_devices/mig_device"):
        device = _count(_text(mig, "index"))
        gi = _count(_text(mig, "gpu_instance_id"))
        ci = _count(_text(mig, "compute_instance_id"))
        names = by_device.get(device)
        profile = names.profile if names else "unknown"
        # Errors in this slice's SRAM are its own; the card's DRAM errors reach every slice.
        own_ecc = _count(_text(mig, "ecc_error_count/volatile_count/sram_uncorrectable"))
        unusable = _ecc_unusable(ecc + own_ecc)
        if names is None and not unusable:
            # CUDA_VISIBLE_DEVICES needs the MIG-... UUID, which only `nvidia-smi -L` (or
            # NVML) gives; without it nothing can be started on this slice.
            unusable = "MIG instance UUID unknown: nvidia-smi -L did not list it"
        instances.append(
            GpuInfo(
                index=mig_index(card.index, device),
                uuid=names.uuid if names else "",
                name=f"{card.name} MIG {profile}",
                gpu_class=mig_class(card.gpu_class, profile),
                memory_mb=_mib(_text(mig, "fb_memory_usage/total")),
                memory_used_mb=_mib(_text(mig, "fb_memory_usage/used")),
                pci_bus_id=card.pci_bus_id,
                numa_node=card.numa_node,
                processes=[p for g, c, p in processes if (g, c) == (str(gi), str(ci))],
                ecc_uncorrected=ecc + own_ecc,
                mig=MigInstance(
                    parent_index=card.index,
                    parent_uuid=card.uuid,
                    profile=profile,
                    gpu_instance_id=gi,
                    compute_instance_id=ci,
                ),
                fabric=card.fabric,
                unusable=unusable,
            )
        )
    return instances


def parse_nvidia_smi_xml(
    text: str, listed: list[ListedGpu] | None = None, compute_caps: dict[int, str] | None = None
) -> NvidiaSmiReport:
    """Driver, CUDA version and every GPU placement can use from `nvidia-smi -q -x`.

    `listed` (`nvidia-smi -L`) names MIG instances; `compute_caps` comes from the compute_cap
    query. A card in MIG mode is reported as its instances; one with none carved, as itself
    and unusable with that reason.
    """
    root = ET.fromstring(_strip_doctype(text))  # noqa: S314 - local tool output, entities refused
    listed_by_index = {card.index: card for card in listed or []}
    caps = compute_caps or {}
    gpus: list[GpuInfo] = []
    cards: list[CardReport] = []
    for position, gpu in enumerate(root.findall("gpu")):
        name = _text(gpu, "product_name")
        memory_mib = _mib(_text(gpu, "fb_memory_usage/total"))
        minor = _text(gpu, "minor_number")
        # The minor number is what /dev/nvidiaN uses and, with CUDA_DEVICE_ORDER=PCI_BUS_ID,
        # nvidia-smi's index; it is N/A on some virtualised boards, where list order is all
        # there is.
        index = int(minor) if minor.isdigit() else position
        ecc = _uncorrected_ecc(gpu)
        mig_current = _known(_text(gpu, "mig_mode/current_mig")) or ""
        processes = _processes(gpu)
        card = GpuInfo(
            index=index,
            uuid=_text(gpu, "uuid"),
            name=name,
            gpu_class=gpu_class(name, memory_mib),
            memory_mb=memory_mib,
            memory_used_mb=_mib(_text(gpu, "fb_memory_usage/used")),
            pci_bus_id=_text(gpu, "pci/pci_bus_id") or gpu.get("id", ""),
            compute_capability=caps.get(index, ""),
            processes=[p for _, _, p in processes],
            ecc_uncorrected=ecc,
            fabric=_fabric(gpu),
            unusable=_ecc_unusable(ecc),
        )
        instances: list[GpuInfo] = []
        if mig_current == "Enabled":
            instances = [
                i.model_copy(update={"compute_capability": card.compute_capability})
                for i in _mig_instances(gpu, card, listed_by_index.get(index), ecc)
            ]
            if not instances:
                card = card.model_copy(update={"unusable": card.unusable or NO_INSTANCES_CARVED})
        gpus.extend(instances or [card])
        cards.append(
            CardReport(
                index=index,
                uuid=card.uuid,
                name=name,
                gpu_class=card.gpu_class,
                pci_bus_id=card.pci_bus_id,
                mig_current=mig_current,
                mig_pending=_known(_text(gpu, "mig_mode/pending_mig")) or "",
                mig_instances=len(instances),
            )
        )
    return NvidiaSmiReport(
        driver_version=_known(_text(root, "driver_version")),
        cuda_version=_known(_text(root, "cuda_version")),
        gpus=gpus,
        cards=cards,
    )
