"""Pure parsing of `nvidia-smi -q -x` output and the GPU class names placement matches on.

nvidia-smi is the cgo-free, NVML-free path: it is on every machine with a driver and its XML
is stable across driver releases for the fields used here.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from workflows.contracts import GpuInfo

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


@dataclass(frozen=True)
class NvidiaSmiReport:
    driver_version: str | None
    cuda_version: str | None
    gpus: list[GpuInfo] = field(default_factory=list)


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


def _strip_doctype(text: str) -> str:
    # nvidia-smi names an external DTD it never ships; ElementTree would ignore it, but an
    # internal subset could declare entities, and a discovery parser has no use for either.
    if "<!ENTITY" in text:
        raise ValueError("nvidia-smi XML declares entities; refusing to parse it")
    return re.sub(r"<!DOCTYPE[^>]*>", "", text, count=1)


def parse_nvidia_smi_xml(text: str) -> NvidiaSmiReport:
    """Driver, CUDA version and every GPU from `nvidia-smi -q -x`, in the order listed."""
    root = ET.fromstring(_strip_doctype(text))  # noqa: S314 - local tool output, entities refused
    gpus: list[GpuInfo] = []
    for index, gpu in enumerate(root.findall("gpu")):
        name = _text(gpu, "product_name")
        memory_mib = _mib(_text(gpu, "fb_memory_usage/total"))
        minor = _text(gpu, "minor_number")
        gpus.append(
            GpuInfo(
                # The minor number is what CUDA_VISIBLE_DEVICES-by-index and /dev/nvidiaN use;
                # it is N/A on some virtualised boards, where list order is all there is.
                index=int(minor) if minor.isdigit() else index,
                uuid=_text(gpu, "uuid"),
                name=name,
                gpu_class=gpu_class(name, memory_mib),
                memory_mb=memory_mib,
                pci_bus_id=_text(gpu, "pci/pci_bus_id") or gpu.get("id", ""),
            )
        )
    return NvidiaSmiReport(
        driver_version=_known(_text(root, "driver_version")),
        cuda_version=_known(_text(root, "cuda_version")),
        gpus=gpus,
    )
