"""RDMA ports from sysfs (native InfiniBand and RoCE) and the management interface.

Everything reads from a root directory or from text, so tests feed recorded trees; the
defaults are the real locations. A machine without /sys/class/infiniband has no RDMA ports,
which is a single-node or TCP-only machine, not an error.
"""

from __future__ import annotations

import ipaddress
import re
import shutil
import subprocess
from pathlib import Path

from workflows.contracts import NetworkPort

SYSFS_INFINIBAND = Path("/sys/class/infiniband")
IP_TIMEOUT_S = 10.0
# The port counters an operator looks at first; the rest are kept too, but these are always
# reported, as 0 where the file is absent (some are missing on older mlx4 firmware).
KEY_COUNTERS = (
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "port_rcv_errors",
    "port_xmit_discards",
    "excessive_buffer_overrun_errors",
    "local_link_integrity_errors",
)
_RATE = re.compile(r"^\s*([\d.]+)\s*Gb/sec")
_ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def _read(path: Path) -> str:
    # Unpopulated GID entries answer EINVAL on read: absent and unreadable mean the same here.
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def parse_port_state(text: str) -> str:
    """ "4: ACTIVE" -> "ACTIVE"; "5: LinkUp" -> "LinkUp"."""
    _, sep, name = text.partition(":")
    return name.strip() if sep else text.strip()


def parse_rate_gbps(text: str) -> float:
    """ "400 Gb/sec (4X NDR)" -> 400.0; "2.5 Gb/sec (1X SDR)" -> 2.5."""
    match = _RATE.match(text)
    return float(match.group(1)) if match else 0.0


def is_ipv4_mapped(gid: str) -> bool:
    """An IPv4-mapped GID (::ffff:a.b.c.d), which is how RoCE carries an IPv4 address."""
    try:
        address = ipaddress.IPv6Address(gid)
    except ValueError:
        return False
    return address.ipv4_mapped is not None


def roce_v2_ipv4_gid_index(gids: dict[int, tuple[str, str]]) -> int | None:
    """The lowest GID index whose type is RoCE v2 and whose GID holds an IPv4 address.

    `gids` maps index -> (gid, type). NCCL's default index 0 is a RoCE v1 link-local entry
    on most hosts, which does not route; this is the index to give as NCCL_IB_GID_INDEX.
    """
    for index in sorted(gids):
        gid, kind = gids[index]
        if kind.strip().lower() == "roce v2" and is_ipv4_mapped(gid):
            return index
    return None


def _gids(port: Path) -> dict[int, tuple[str, str]]:
    found: dict[int, tuple[str, str]] = {}
    gid_dir = port / "gids"
    if not gid_dir.is_dir():
        return found
    for entry in gid_dir.iterdir():
        if not entry.name.isdigit():
            continue
        gid = _read(entry)
        if not gid or gid == _ZERO_GID:
            continue
        kind = _read(port / "gid_attrs" / "types" / entry.name)
        found[int(entry.name)] = (gid, kind)
    return found


def _counters(port: Path) -> dict[str, int]:
    counters: dict[str, int] = dict.fromkeys(KEY_COUNTERS, 0)
    directory = port / "counters"
    if directory.is_dir():
        for entry in directory.iterdir():
            value = _read(entry)
            if value.isdigit():
                counters[entry.name] = int(value)
    return counters


def _netdev(device: Path, port: Path, gid_index: int | None) -> str:
    # The GID table names the Ethernet interface behind each RoCE entry; the PCI device's net/
    # directory is the fallback (an mlx5 function has one netdev per port).
    if gid_index is not None:
        name = _read(port / "gid_attrs" / "ndevs" / str(gid_index))
        if name:
            return name
    net = device / "device" / "net"
    if net.is_dir():
        names = sorted(p.name for p in net.iterdir())
        if names:
            return names[0]
    return ""


def read_rdma_ports(root: Path | str = SYSFS_INFINIBAND) -> list[NetworkPort]:
    """Every port of every RDMA device under `root` (default /sys/class/infiniband)."""
    base = Path(root)
    if not base.is_dir():
        return []
    ports: list[NetworkPort] = []
    for device in sorted(base.iterdir(), key=lambda p: p.name):
        ports_dir = device / "ports"
        if not ports_dir.is_dir():
            continue
        for port in sorted(ports_dir.iterdir(), key=lambda p: p.name):
            if not port.name.isdigit():
                continue
            link_layer = _read(port / "link_layer")
            gid_index = roce_v2_ipv4_gid_index(_gids(port)) if link_layer == "Ethernet" else None
            ports.append(
                NetworkPort(
                    device=device.name,
                    port=int(port.name),
                    link_layer=link_layer,
                    state=parse_port_state(_read(port / "state")),
                    phys_state=parse_port_state(_read(port / "phys_state")),
                    rate_gbps=parse_rate_gbps(_read(port / "rate")),
                    netdev=_netdev(device, port, gid_index) if link_layer == "Ethernet" else "",
                    roce_v2_gid_index=gid_index,
                    counters=_counters(port),
                )
            )
    return ports


def parse_ip_addr(text: str) -> list[tuple[str, str]]:
    """(interface, address) pairs from `ip -o -4 addr show`.

    Each line is "2: eno1    inet 10.0.0.5/24 brd 10.0.0.255 scope global eno1\\ ...".
    """
    pairs: list[tuple[str, str]] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "inet":
            pairs.append((fields[1].rstrip(":").split("@", 1)[0], fields[3].split("/", 1)[0]))
    return pairs


def interface_for_address(text: str, address: str) -> str:
    """The interface holding `address`: NCCL_SOCKET_IFNAME for this node. "" when none does
    (the agent was given a NAT or load-balancer address, or a hostname)."""
    for name, held in parse_ip_addr(text):
        if held == address:
            return name
    return ""


def management_interface(address: str) -> str:
    """Gather: run `ip -o -4 addr show` and find the interface holding `address`."""
    ip = shutil.which("ip")
    if ip is None:
        return ""
    try:
        done = subprocess.run(
            [ip, "-o", "-4", "addr", "show"],
            capture_output=True,
            text=True,
            timeout=IP_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return interface_for_address(done.stdout, address) if done.returncode == 0 else ""
