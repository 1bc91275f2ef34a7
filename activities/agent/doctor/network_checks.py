"""RDMA checks: InfiniBand and RoCE ports, their error counters, the kernel modules NCCL needs,
GPUDirect, the RoCE v2 GID, and the management interface NCCL bootstraps over."""

from __future__ import annotations

import ipaddress

from activities.agent.doctor.facts import DoctorFacts
from activities.agent.doctor.findings import Finding, Severity
from workflows.contracts import NetworkPort

# Counters that only ever count trouble. Traffic counters (port_xmit_data, ...) and
# port_xmit_wait (congestion, normal under load) are left out.
ERROR_COUNTERS = frozenset(
    {
        "symbol_error",
        "link_error_recovery",
        "link_downed",
        "port_rcv_errors",
        "port_rcv_remote_physical_errors",
        "port_rcv_switch_relay_errors",
        "port_xmit_discards",
        "port_xmit_constraint_errors",
        "port_rcv_constraint_errors",
        "local_link_integrity_errors",
        "excessive_buffer_overrun_errors",
        "VL15_dropped",
        # RoCE hw_counters
        "out_of_sequence",
        "packet_seq_err",
        "local_ack_timeout_err",
        "rnr_nak_retry_err",
        "req_transport_retries_exceeded",
        "rx_icrc_encapsulated",
    }
)
# The verbs provider module for each adapter family, by device name prefix.
PROVIDERS = {"mlx5_": "mlx5_ib", "bnxt_re": "bnxt_re", "irdma": "irdma", "rdmap": "efa"}
PERSIST = "list it in /etc/modules-load.d/rdma.conf so it loads at boot"


def _name(port: NetworkPort) -> str:
    kind = "RoCE" if port.kind == "roce" else "InfiniBand"
    netdev = f", {port.netdev}" if port.netdev else ""
    return f"{port.device}/{port.port} ({kind}{netdev})"


def _down_fix(port: NetworkPort) -> str:
    if port.kind == "infiniband" and port.state.upper().endswith("INIT"):
        return (
            "the link is up but no subnet manager configured it: run opensm on one node of the "
            "fabric or enable the switch's SM"
        )
    if port.kind == "roce" and port.netdev:
        return (
            f"`sudo ip link set {port.netdev} up`; if it stays down, check the cable and the "
            f"switch port (`ethtool {port.netdev}`)"
        )
    return f"check the cable and the switch port; `ibstat {port.device} {port.port}` shows more"


def port_checks(facts: DoctorFacts) -> list[Finding]:
    findings: list[Finding] = []
    for port in facts.inventory.network_ports:
        if not port.active:
            phys = f", physical {port.phys_state}" if port.phys_state else ""
            findings.append(
                Finding(
                    severity=Severity.WARN,
                    check="rdma-port",
                    message=f"port {_name(port)} is {port.state or 'in an unknown state'}{phys}: "
                    "nothing goes over it",
                    fix=_down_fix(port),
                )
            )
        errors = {k: v for k, v in sorted(port.counters.items()) if k in ERROR_COUNTERS and v}
        if errors:
            listed = ", ".join(f"{k}={v}" for k, v in errors.items())
            findings.append(
                Finding(
                    severity=Severity.WARN,
                    check="rdma-counters",
                    message=f"port {_name(port)} counts errors: {listed}",
                    fix="a dirty or failing link: reseat or replace the cable or transceiver; "
                    f"watch whether they grow under /sys/class/infiniband/{port.device}/ports/"
                    f"{port.port}/counters",
                )
            )
    return findings


def _required_modules(ports: list[NetworkPort]) -> list[str]:
    # ib_uverbs is what NCCL opens (/dev/infiniband/uverbsN): without it every adapter is
    # invisible and NCCL quietly falls back to sockets.
    needed = ["ib_core", "ib_uverbs"]
    for port in ports:
        for prefix, module in PROVIDERS.items():
            if port.device.startswith(prefix) and module not in needed:
                needed.append(module)
    return needed


def rdma_module_checks(facts: DoctorFacts) -> list[Finding]:
    ports = facts.inventory.network_ports
    if not ports:
        return []
    if facts.kernel_modules is None:
        return [
            Finding(
                severity=Severity.WARN,
                check="rdma-modules",
                message="RDMA ports exist but the loaded kernel modules could not be read",
                fix="on the host: `lsmod | grep -e ib_ -e mlx5 -e peermem`",
            )
        ]
    findings: list[Finding] = []
    missing = [m for m in _required_modules(ports) if not facts.has_module(m)]
    if missing:
        findings.append(
            Finding(
                severity=Severity.FAIL,
                check="rdma-modules",
                message=f"RDMA ports exist but {', '.join(missing)} not loaded: NCCL cannot "
                "open the adapters and multi-node traffic falls back to sockets or hangs",
                fix=f"`sudo modprobe {' '.join(missing)}` (package rdma-core); {PERSIST}",
            )
        )
    else:
        findings.append(
            Finding(
                severity=Severity.OK,
                check="rdma-modules",
                message="RDMA modules loaded: " + ", ".join(_required_modules(ports)),
            )
        )
    if not facts.has_module("rdma_ucm"):
        findings.append(
            Finding(
                severity=Severity.WARN,
                check="rdma-modules",
                message="rdma_ucm is not loaded: tools and transports that connect through "
                "the RDMA connection manager (UCX, MPI, `ib_write_bw -R`) cannot",
                fix=f"`sudo modprobe rdma_ucm`; {PERSIST}",
            )
        )
    if facts.inventory.gpus:
        findings.extend(_gpudirect(facts))
    return findings


def _gpudirect(facts: DoctorFacts) -> list[Finding]:
    findings: list[Finding] = []
    if not facts.has_module("nvidia_peermem", "nv_peer_mem"):
        findings.append(
            Finding(
                severity=Severity.WARN,
                check="gpudirect",
                message="GPUDirect RDMA is off: nvidia_peermem is not loaded, so NCCL stages "
                "GPU traffic through host memory (lower bandwidth, more CPU). With the open "
                "kernel modules on Linux 5.12 or newer NCCL can use DMA-BUF instead",
                fix="`sudo modprobe nvidia-peermem`; list nvidia-peermem in "
                "/etc/modules-load.d/ so it loads at boot (after the nvidia module)",
            )
        )
    else:
        findings.append(
            Finding(severity=Severity.OK, check="gpudirect", message="GPUDirect RDMA loaded")
        )
    if not facts.has_module("gdrdrv"):
        findings.append(
            Finding(
                severity=Severity.INFO,
                check="gdrcopy",
                message="GDRCopy (gdrdrv) is not loaded: optional, it lowers NCCL's "
                "small-message latency",
            )
        )
    return findings


def roce_gid_checks(facts: DoctorFacts) -> list[Finding]:
    findings: list[Finding] = []
    for port in facts.inventory.network_ports:
        if port.kind != "roce" or not port.active:
            continue
        if port.roce_v2_gid_index is None:
            iface = port.netdev or "its Ethernet interface"
            findings.append(
                Finding(
                    severity=Severity.FAIL,
                    check="roce-gid",
                    message=f"RoCE port {_name(port)} has no RoCE v2 GID with an IPv4 address: "
                    "NCCL would use the default GID, a RoCE v1 link-local entry that does not "
                    "route, and multi-node jobs over it hang",
                    fix=f"give {iface} an IPv4 address (the GID table then gains a v2 entry "
                    f"for it); check with `grep . /sys/class/infiniband/{port.device}/ports/"
                    f"{port.port}/gid_attrs/types/*`",
                )
            )
        else:
            findings.append(
                Finding(
                    severity=Severity.OK,
                    check="roce-gid",
                    message=f"RoCE port {_name(port)} uses GID index {port.roce_v2_gid_index} "
                    "(RoCE v2, IPv4)",
                )
            )
    return findings


def management_interface_checks(facts: DoctorFacts) -> list[Finding]:
    inv = facts.inventory
    findings: list[Finding] = []
    try:
        loopback = ipaddress.ip_address(inv.address).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        findings.append(
            Finding(
                severity=Severity.INFO,
                check="address",
                message=f"the node's address is {inv.address}: engines here are reachable "
                "from this machine only, and no multi-node job can include it",
                fix="give the agent this machine's network address: `--address <ip>`",
            )
        )
    # A loopback node's interface is lo, and the finding above already says what that means.
    if not inv.management_interface and not loopback:
        findings.append(
            Finding(
                severity=Severity.WARN,
                check="management-interface",
                message=f"no network interface holds the node's address {inv.address}: NCCL "
                "and Gloo would bootstrap over whichever interface they find first",
                fix="start the agent with `--address` set to one of this machine's addresses "
                "(`ip -br addr`)",
            )
        )
    return findings
