"""Install llama-server on this node: the official release archive for its processor (checked
against the published sha256), or a build from source where no archive can be fetched (and on
NVIDIA nodes, for which llama.cpp publishes no Linux CUDA archive), or an operator's binary.
Placed in its versioned engine directory and counted installed only once it is seen to run (a
CUDA build: once it lists a CUDA device).

Failures the same attempt would repeat (a build error, a missing library, a digest mismatch)
come back as a FAILED status with the reason; only transient ones (the sdist download) raise, so
Temporal retries them.
"""

from __future__ import annotations

import platform
import re
import shutil
from pathlib import Path

from engines.build_llamacpp import (
    BINARY,
    BuildFailedError,
    Progress,
    TransientInstallError,
    build_llamacpp,
)
from engines.engine_dir import (
    engine_dir,
    exclusive,
    installed_binary,
    place,
    read_marker,
    remove_marker,
    write_marker,
)
from engines.os_packages import install_missing
from engines.release_llamacpp import (
    ArchiveRejectedError,
    ArchiveUnavailableError,
    fetch_release,
)
from engines.verify import Verification, check_libraries, verify_llamacpp
from workflows.contracts import EngineRequirement, EngineSource, EngineState, EngineStatus
from workflows.engine_plan import LLAMACPP as ENGINE  # engines.llamacpp imports this module
from workflows.engine_plan import LLAMACPP_DEFAULT_VERSION

__all__ = ["TransientInstallError", "install_llamacpp", "installed_binary"]

# The version names a directory: nothing that could climb out of engines_root.
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")


def _status(version: str, check: Verification, binary: Path) -> EngineStatus:
    if not check.ok:
        return EngineStatus(
            engine=ENGINE, version=version, state=EngineState.FAILED, detail=check.detail
        )
    detail = "; ".join((check.detail, *check.notes))
    return EngineStatus(
        engine=ENGINE,
        version=version,
        state=EngineState.INSTALLED,
        path=str(binary),
        detail=detail,
    )


def _failed(version: str, reason: str) -> EngineStatus:
    return EngineStatus(engine=ENGINE, version=version, state=EngineState.FAILED, detail=reason)


def verify_operator_binary(version: str, path: str) -> EngineStatus:
    """An operator-named binary is checked, never installed or replaced."""
    binary = Path(path).expanduser()
    return _status(version, verify_llamacpp(binary), binary)


def nvidia_driver_loaded() -> bool:
    """The kernel module's own file: present exactly while an NVIDIA driver is loaded."""
    return Path("/proc/driver/nvidia/version").exists()


def _obtain(
    req: EngineRequirement, version: str, cache_dir: Path, progress: Progress, nvidia: bool
) -> Path:
    """The directory to place: the release archive's contents, else a build from source."""
    if req.source is EngineSource.RELEASE:
        try:
            return fetch_release(req, cache_dir, platform.machine(), nvidia, progress)
        except ArchiveUnavailableError as err:
            progress(f"{err}; building from source instead")
    return build_llamacpp(version, cache_dir, progress, cuda=nvidia)


def install_llamacpp(
    req: EngineRequirement,
    engines_root: Path,
    cache_dir: Path,
    progress: Progress,
    nvidia: bool | None = None,
    os_packages: bool = False,
) -> EngineStatus:
    """`nvidia`: whether this node has an NVIDIA driver loaded (None: look)."""
    version = req.version or LLAMACPP_DEFAULT_VERSION
    if req.path:
        progress(f"verifying operator-provided {req.path}")
        return verify_operator_binary(version, req.path)
    if not _VERSION.match(version):
        return _failed(version, f"invalid llama.cpp version {version!r}")
    if nvidia is None:
        nvidia = nvidia_driver_loaded()

    directory = engine_dir(engines_root, ENGINE, version)
    with exclusive(engines_root / ENGINE / f".{version}.lock"):
        marker = read_marker(directory)
        if marker is not None:
            progress(f"re-verifying installed llama-server {version}")
            check = verify_llamacpp(directory / marker.binary)
            if check.ok:
                return _status(version, check, directory / marker.binary)
            # Something removed a file since (an upgrade, a cleanup): reinstall from the cache,
            # and if a system library is what is missing, the new copy fails and says which.
            progress(f"installed copy no longer runs ({check.detail}); reinstalling")
            remove_marker(directory)

        try:
            dist = _obtain(req, version, cache_dir, progress, nvidia)
        except (BuildFailedError, ArchiveRejectedError) as err:
            return _failed(version, str(err))

        progress(f"installing llama-server {version}")
        place(dist, directory)
        progress(f"verifying llama-server {version}")
        check = verify_llamacpp(directory / BINARY)
        if not check.ok:
            check = with_os_packages(directory / BINARY, check, os_packages, progress)
        if not check.ok:
            shutil.rmtree(directory, ignore_errors=True)
            return _failed(version, check.detail)
        write_marker(directory, ENGINE, version, BINARY, check.detail)
        return _status(version, check, directory / BINARY)


def with_os_packages(
    binary: Path, check: Verification, consent: bool, progress: Progress
) -> Verification:
    """A binary that fails for want of system libraries: with the operator's consent, install
    their packages from the node's own sources and verify again; without it, say how."""
    missing, _ = check_libraries(binary)
    if not missing:
        return check
    if consent:
        progress(f"installing what ships {', '.join(missing)} from this node's package sources")
    outcome = install_missing(missing, consent)
    if not outcome.installed:
        return Verification(False, f"{check.detail}: {outcome.detail}", check.notes)
    again = verify_llamacpp(binary)
    if not again.ok:
        return Verification(False, f"{again.detail} (after it {outcome.detail})", again.notes)
    return Verification(True, again.detail, (*again.notes, outcome.detail))
