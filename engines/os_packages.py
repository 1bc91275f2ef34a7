"""A library an engine lacks, installed from the node's own package sources, only with the
operator's consent (`llmgw agent --install-os-packages`).

ldd names a missing library by its soname (`libgomp.so.1 => not found`); the package that ships
it has another name on each distribution. This knows the libraries engines are known to lack on
a fresh machine and their packages for apt (Debian, Ubuntu) and dnf (RHEL, Fedora); the node's
own package manager installs them from whatever sources the node is configured with, never from
elsewhere. Without consent, the failure says the exact command instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

INSTALL_TIMEOUT_S = 600.0
APT, DNF = "apt-get", "dnf"
# soname -> (apt package, dnf package)
LIBRARY_PACKAGES: dict[str, tuple[str, str]] = {
    "libgomp.so.1": ("libgomp1", "libgomp"),
    "libcurl.so.4": ("libcurl4", "libcurl"),
    "libssl.so.3": ("libssl3", "openssl-libs"),
    "libcrypto.so.3": ("libssl3", "openssl-libs"),
    "libnuma.so.1": ("libnuma1", "numactl-libs"),
    "libstdc++.so.6": ("libstdc++6", "libstdc++"),
    "libvulkan.so.1": ("libvulkan1", "vulkan-loader"),
    "libopenblas.so.0": ("libopenblas0", "openblas"),
    "libtcmalloc.so.4": ("libgoogle-perftools4", "gperftools-libs"),
}

Run = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def package_manager() -> str | None:
    """The node's package manager: apt-get, else dnf; None for neither."""
    return next((tool for tool in (APT, DNF) if shutil.which(tool)), None)


def packages_for(libraries: list[str], manager: str) -> tuple[list[str], list[str]]:
    """(the packages that ship these libraries, the libraries no known package ships)."""
    column = 0 if manager == APT else 1
    packages: list[str] = []
    unknown: list[str] = []
    for library in libraries:
        known = LIBRARY_PACKAGES.get(library)
        if known is None:
            unknown.append(library)
        elif known[column] not in packages:
            packages.append(known[column])
    return packages, unknown


def install_command(manager: str, packages: list[str], simulate: bool = False) -> list[str]:
    if manager == APT:
        return [APT, "install", "-y", "--no-install-recommends", *(["-s"] if simulate else []),
                *packages]  # fmt: skip
    return [DNF, "install", "-y", *(["--assumeno"] if simulate else []), *packages]


@dataclass(frozen=True)
class Outcome:
    installed: bool
    detail: str  # what was done, or what the operator can do


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, env=env, check=False
    )


def install_missing(
    libraries: list[str], consent: bool, manager: str | None = None, run: Run | None = None
) -> Outcome:
    """Install the packages that ship `libraries` when the operator consented; else say how."""
    manager = manager or package_manager()
    if manager is None:
        return Outcome(False, "no apt-get or dnf here to install them with")
    packages, unknown = packages_for(libraries, manager)
    if not packages:
        return Outcome(False, f"no known package ships {', '.join(unknown)}")
    command = install_command(manager, packages)
    shown = " ".join(command)
    if not consent:
        return Outcome(
            False, f"install them with `{shown}`, or let the agent: --install-os-packages"
        )
    if os.geteuid() != 0:
        return Outcome(False, f"`{shown}` needs root; the agent does not run as root")
    try:
        done = (run or _run)(command)
    except (OSError, subprocess.TimeoutExpired) as err:
        return Outcome(False, f"`{shown}` failed: {err}")
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-400:]
        return Outcome(False, f"`{shown}` exited {done.returncode}: {tail}")
    left = f"; no known package ships {', '.join(unknown)}" if unknown else ""
    return Outcome(True, f"installed {', '.join(packages)} with {manager}{left}")
