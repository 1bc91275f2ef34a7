"""Hosts made of Linux network namespaces on this machine, for tests of llmgw across a network.

Each host is a namespace of its own with one interface (`eth0`, an address in SUBNET) cabled by a
veth pair to a bridge in a further "switch" namespace. Nothing is added to the machine's own
namespace and no host has a default route, so the test's traffic stays between the namespaces it
made. Cutting a host off is its cable's switch end set down, as a pulled cable would be.

Processes run in a host with `ip netns exec`; they share this machine's file systems, so a test
reads their state directories directly. `Network.destroy` kills every process left in its
namespaces (agents, engines, servers) and deletes them, veths and bridge included.
"""

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

SUBNET = "10.77.0"  # a /24 inside the test's namespaces only
BRIDGE = "br0"
HOST_IF = "eth0"


class NetnsError(RuntimeError):
    pass


def ip(*args: str) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if result.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {result.stderr.strip() or result.returncode}")
    return result.stdout


def why_unavailable() -> str | None:
    """Why this machine cannot host the test's namespaces, or None when it can."""
    if os.geteuid() != 0:
        return "creating network namespaces needs root (CI runs the suite as root)"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) to create network namespaces with"
    probe = f"llmgw-probe-{os.getpid()}-{secrets.token_hex(2)}"
    try:
        ip("netns", "add", probe)
        ip("-n", probe, "link", "add", "probe0", "type", "veth", "peer", "name", "probe1")
        ip("-n", probe, "link", "add", "probe2", "type", "bridge")
        ip("netns", "exec", probe, "true")
    except NetnsError as err:
        return f"this machine refuses network namespaces, veth pairs or bridges ({err})"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


@dataclass(frozen=True)
class Host:
    name: str  # "ctl", "n1", ...: also its switch port's name
    netns: str  # unique to this run
    address: str


# `llmgw-<pid of the test process>-<4 hex>-<host>`: a run's namespaces, told by its pid.
RUN_NETNS = re.compile(r"^llmgw-(\d+)-[0-9a-f]{4}-")


class Network:
    """A switch and the hosts cabled to it; every name carries this run's own prefix."""

    def __init__(self) -> None:
        self.prefix = f"llmgw-{os.getpid()}-{secrets.token_hex(2)}"
        self.switch = f"{self.prefix}-switch"
        self.hosts: dict[str, Host] = {}
        self._made: list[str] = []  # namespaces, in the order made

    def create(self) -> None:
        self._add_netns(self.switch)
        ip("-n", self.switch, "link", "add", BRIDGE, "type", "bridge")
        ip("-n", self.switch, "link", "set", BRIDGE, "up")

    def add_host(self, name: str, last_octet: int) -> Host:
        host = Host(name, f"{self.prefix}-{name}", f"{SUBNET}.{last_octet}")
        self._add_netns(host.netns)
        ip("-n", host.netns, "link", "set", "lo", "up")
        # Made in the switch's namespace with its peer straight in the host's: no interface
        # ever exists in this machine's own namespace, so no name there can clash.
        ip("-n", self.switch, "link", "add", name, "type", "veth",
           "peer", "name", HOST_IF, "netns", host.netns)  # fmt: skip
        ip("-n", self.switch, "link", "set", name, "master", BRIDGE)
        ip("-n", self.switch, "link", "set", name, "up")
        ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", HOST_IF)
        ip("-n", host.netns, "link", "set", HOST_IF, "up")
        self.hosts[name] = host
        return host

    def _add_netns(self, netns: str) -> None:
        ip("netns", "add", netns)
        self._made.append(netns)

    def cut(self, name: str) -> None:
        """Pull the host's cable: its switch port down."""
        ip("-n", self.switch, "link", "set", name, "down")

    def heal(self, name: str) -> None:
        ip("-n", self.switch, "link", "set", name, "up")

    def popen(
        self,
        name: str,
        cmd: Sequence[str],
        *,
        env: Mapping[str, str],
        log: Path,
        cwd: Path,
        stdin: int | IO[bytes] | None = subprocess.DEVNULL,
        stdout: int | IO[bytes] | None = None,
    ) -> subprocess.Popen[bytes]:
        """`cmd` in the host's namespace; its output appended to `log` (stdout to `stdout`
        instead when given). `ip netns exec` execs the command, so the pid is the command's."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as sink:
            return subprocess.Popen(
                ["ip", "netns", "exec", self.hosts[name].netns, *cmd],
                cwd=cwd, env=dict(env), stdin=stdin,
                stdout=sink if stdout is None else stdout, stderr=sink,
            )  # fmt: skip

    def run(
        self, name: str, cmd: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", self.hosts[name].netns, *cmd],
            cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip

    def destroy(self) -> list[str]:
        """Kill what runs in the namespaces, then delete them (their veths and the bridge go
        with them). Returns what could not be undone, for the caller to report."""
        problems = []
        for netns in reversed(self._made):
            for _ in range(50):
                pids = _pids_in(netns)
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.1)
            else:
                problems.append(f"{netns}: processes {_pids_in(netns)} outlived SIGKILL")
            try:
                ip("netns", "del", netns)
            except NetnsError as err:
                problems.append(str(err))
        self._made.clear()
        return problems


def sweep_abandoned() -> list[str]:
    """Remove what a run killed before its finalizers (SIGKILL, a lost machine) left: namespaces
    named by a test process that no longer exists, with whatever still runs in them."""
    abandoned = []
    for line in ip("netns", "list").splitlines():
        name = line.split(" ", 1)[0]
        found = RUN_NETNS.match(name)
        if found is None or Path(f"/proc/{found.group(1)}").exists():
            continue
        for pid in _pids_in(name):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(NetnsError):
            ip("netns", "del", name)
            abandoned.append(name)
    return abandoned


def _pids_in(netns: str) -> list[int]:
    try:
        return [int(p) for p in ip("netns", "pids", netns).split()]
    except NetnsError:
        return []
