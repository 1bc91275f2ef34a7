"""Which CUDA an engine's builds need, by engine version: the facts the install plan and the node
doctor judge a node's NVIDIA driver and GPUs against.

An engine installed with pip brings its own CUDA runtime inside the PyTorch it pins, so what a
node must have is a driver new enough for that runtime's major version (CUDA minor version
compatibility lets any 12.x driver run a 12.y build) and GPUs that runtime still compiles for.
Both follow the engine's version: vLLM 0.20.0 moved from PyTorch 2.10 (CUDA 12.8) to PyTorch
2.11, whose wheels bundle CUDA 13.0; SGLang 0.5.11 did the same. CUDA 13 builds no longer run
on Maxwell, Pascal or Volta GPUs (compute capability below 7.5) and need an R580 driver.

Pure data and arithmetic, importing nothing but the standard library: the row of each engine
(engine_facts.py) lists its builds, and the plan runs inside an activity, the doctor on the node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The oldest Linux driver branch that runs each CUDA major version's builds (NVIDIA's CUDA
# toolkit release notes: 525.60.13 for 12.x by minor version compatibility, 580.65.06 for 13.x).
DRIVER_BRANCH_FOR_CUDA = {12: "525", 13: "580"}


@dataclass(frozen=True)
class CudaBuild:
    """What an engine's GPU builds from the package registry need, from version `since` on
    (until the next entry of its row's list)."""

    since: str  # the first engine version built this way; "0" for the oldest
    cuda_major: int
    # The oldest GPU architecture the builds run on, "7.5"; "" when not known.
    min_compute_capability: str = ""


def version_key(version: str) -> tuple[int, ...]:
    """The leading numbers of a version, for ordering: "0.5.10.post1" -> (0, 5, 10)."""
    numbers: list[int] = []
    for part in version.strip().split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits.group()))
        if digits.group() != part:
            break  # "10rc0", "1-1": what follows the digits is not a further number
    return tuple(numbers)


def build_for(builds: tuple[CudaBuild, ...], version: str) -> CudaBuild | None:
    """The entry covering `version` (builds are listed oldest first); None when the row lists
    none or the version is not a number."""
    key = version_key(version)
    if not key:
        return None
    found: CudaBuild | None = None
    for build in builds:
        if version_key(build.since) <= key:
            found = build
    return found


def cuda_major(version: str | None) -> int | None:
    """The major number of a CUDA version as nvidia-smi reports it ("12.4" -> 12)."""
    if not version:
        return None
    head = version.strip().split(".")[0]
    return int(head) if head.isdigit() else None


def driver_fix(cuda: int) -> str:
    branch = DRIVER_BRANCH_FOR_CUDA.get(cuda)
    if branch is None:
        return f"upgrade the NVIDIA driver to a branch supporting CUDA {cuda}, then reboot"
    return f"upgrade the NVIDIA driver to {branch} or newer (CUDA {cuda}), then reboot"


@dataclass(frozen=True)
class CudaShortfall:
    """Why a node cannot run an engine version's GPU builds, and what would fix it."""

    message: str
    fix: str


def cuda_shortfall(
    title: str,
    version: str,
    builds: tuple[CudaBuild, ...],
    driver: str,
    driver_cuda: str | None,
    compute_capabilities: list[str],
) -> CudaShortfall | None:
    """Whether a node whose driver supports `driver_cuda` and whose usable GPUs have
    `compute_capabilities` falls short of `title` at `version`; None when it does not, or when
    what would decide it is unknown (no CUDA version reported, no capability read). An unknown
    or unnumbered version is judged by the engine's oldest builds."""
    if not builds:
        return None
    build = build_for(builds, version) or builds[0]
    named = f"{title} {version}" if version else title
    before = [b for b in builds if version_key(b.since) < version_key(build.since)]
    previous = before[-1] if before else None

    def pin(previous_fits: bool) -> str:
        if not previous_fits:
            return ""
        return (
            f", or give this node a {title} version before {build.since} (an `overrides:` "
            "entry of `engines:`)"
        )

    have = cuda_major(driver_cuda)
    if have is not None and have < build.cuda_major:
        return CudaShortfall(
            message=f"{named} needs a driver for CUDA {build.cuda_major} or newer; driver "
            f"{driver or '?'} supports CUDA {driver_cuda}",
            fix=driver_fix(build.cuda_major)
            + pin(previous is not None and previous.cuda_major <= have),
        )
    floor = version_key(build.min_compute_capability)
    known = [version_key(c) for c in compute_capabilities if version_key(c)]
    if floor and known and len(known) == len(compute_capabilities) and max(known) < floor:
        found = ", ".join(sorted(set(compute_capabilities)))
        earlier_floor = version_key(previous.min_compute_capability) if previous else None
        return CudaShortfall(
            message=f"{named} needs GPUs of compute capability {build.min_compute_capability} "
            f"or newer; this node's are {found}",
            fix="run it on newer GPUs"
            + pin(bool(earlier_floor) and max(known) >= (earlier_floor or ())),
        )
    return None
