"""NVLink checks: NVSwitch and its fabric manager, multi-node NVLink domains, and IMEX."""

from __future__ import annotations

from activities.agent.doctor.facts import DoctorFacts
from activities.agent.doctor.findings import Finding, Severity
from activities.agent.doctor.gpu_checks import are, cards
from engines.nccl_env import nvlink_domain

FM_FIX = (
    "`sudo systemctl enable --now nvidia-fabricmanager` (package nvidia-fabricmanager-<driver "
    "branch>; its version must equal the driver's{driver}); `journalctl -u "
    "nvidia-fabricmanager` says why it stopped"
)
# States in which a GPU takes no part in a fabric at all.
NO_FABRIC = {"", "not supported", "n/a"}


def fabric_manager_checks(facts: DoctorFacts) -> list[Finding]:
    inv = facts.inventory
    if not inv.nvswitch:
        return []
    driver = f", {inv.nvidia_driver}" if inv.nvidia_driver else ""
    state = facts.fabric_manager
    if state == "active":
        return [
            Finding(
                severity=Severity.OK,
                check="fabric-manager",
                message="NVSwitch present and nvidia-fabricmanager is active",
            )
        ]
    if state == "unknown":
        # Without systemd (a container) the service cannot be asked; the GPUs' own fabric
        # state below still tells whether the NVSwitch fabric came up.
        return [
            Finding(
                severity=Severity.WARN,
                check="fabric-manager",
                message="NVSwitch present, and whether nvidia-fabricmanager runs could not be "
                "asked (no systemd); without it CUDA cannot start on these GPUs",
                fix="on the host: `systemctl is-active nvidia-fabricmanager`",
            )
        ]
    return [
        Finding(
            severity=Severity.FAIL,
            check="fabric-manager",
            message=f"NVSwitch present but nvidia-fabricmanager is {state}: CUDA cannot start "
            "on these GPUs (error 802, system not yet initialized) until it runs",
            fix=FM_FIX.format(driver=driver),
        )
    ]


def nvlink_fabric_checks(facts: DoctorFacts) -> list[Finding]:
    """Each GPU's fabric state, one finding per distinct trouble naming the GPUs it hits."""
    inv = facts.inventory
    not_joined: dict[str, list[int]] = {}
    degraded: dict[str, list[int]] = {}
    joined: list[int] = []
    for gpu in inv.gpus:
        fabric = gpu.fabric
        if fabric is None or fabric.state.strip().lower() in NO_FABRIC or gpu.mig is not None:
            continue
        if fabric.state != "Completed" or fabric.status != "Success":
            key = f"state {fabric.state or '?'}, status {fabric.status or '?'}"
            not_joined.setdefault(key, []).append(gpu.index)
        elif fabric.bandwidth and fabric.bandwidth.strip().lower() not in ("full", "n/a"):
            degraded.setdefault(fabric.bandwidth, []).append(gpu.index)
        elif fabric.domain is not None:
            joined.append(gpu.index)
    findings: list[Finding] = []
    # On a GB200-style tray the fabric is managed from the NVLink switch trays; on an HGX board
    # by this node's own fabric manager.
    where = (
        "restart this node's fabric manager: `sudo systemctl restart nvidia-fabricmanager`"
        if inv.nvswitch
        else "check the NVLink switch trays' fabric manager (NMX) for this tray's partition, "
        "then reboot the tray"
    )
    for key, indices in not_joined.items():
        findings.append(
            Finding(
                severity=Severity.FAIL,
                check="nvlink-fabric",
                message=f"{cards(indices)} {are(indices)} not in the NVLink fabric ({key}): "
                "no NVLink traffic to peers until it joins",
                fix=f"{where}; `nvidia-smi -q | grep -A6 Fabric` shows the state",
            )
        )
    for bandwidth, indices in degraded.items():
        findings.append(
            Finding(
                severity=Severity.WARN,
                check="nvlink-bandwidth",
                message=f"{cards(indices)} joined the NVLink fabric with {bandwidth} "
                "bandwidth: a link or switch is down, collectives run slower",
                fix="`nvidia-smi nvlink -s` names the inactive links; check the switch trays "
                "and cable cartridges",
            )
        )
    domain = nvlink_domain(inv)
    if joined and domain is not None and not not_joined:
        findings.append(
            Finding(
                severity=Severity.OK,
                check="nvlink-fabric",
                message=f"{cards(joined)} joined NVLink domain {domain}",
            )
        )
    return findings


def imex_checks(facts: DoctorFacts) -> list[Finding]:
    inv = facts.inventory
    domains = {g.fabric.domain for g in inv.gpus if g.fabric is not None and g.fabric.domain}
    if not domains:
        return []
    domain = sorted(domains)[0]
    imex = inv.imex
    why = (
        f"GPUs in NVLink domain {domain} cannot share memory with the domain's other nodes, "
        "so no model can span them"
    )
    if imex is None or not imex.installed:
        return [
            Finding(
                severity=Severity.FAIL,
                check="imex",
                message=f"nvidia-imex is not installed: {why}",
                fix="install nvidia-imex-<driver branch>, list every node of the domain in "
                "/etc/nvidia-imex/nodes_config.cfg, `sudo systemctl enable --now nvidia-imex`",
            )
        ]
    if not imex.running:
        detail = f" ({imex.detail})" if imex.detail else ""
        return [
            Finding(
                severity=Severity.FAIL,
                check="imex",
                message=f"nvidia-imex is installed but not running{detail}: {why}",
                fix="`sudo systemctl enable --now nvidia-imex`; `journalctl -u nvidia-imex` "
                "and /etc/nvidia-imex/nodes_config.cfg (every node of the domain, same file "
                "everywhere) say why it stopped",
            )
        ]
    if not imex.channels:
        return [
            Finding(
                severity=Severity.FAIL,
                check="imex-channel",
                message="nvidia-imex runs but no IMEX channel exists "
                "(/dev/nvidia-caps-imex-channels/ is empty): CUDA's cross-node memory calls "
                "fail with a permission error",
                fix="create channel 0 (it does not survive a reboot): `sudo mkdir -p "
                "/dev/nvidia-caps-imex-channels && sudo mknod "
                "/dev/nvidia-caps-imex-channels/channel0 c $(awk '$2==\"nvidia-caps-imex-"
                "channels\"{print $1}' /proc/devices) 0`; or load the driver with "
                "NVreg_CreateImexChannel0=1",
            )
        ]
    return [
        Finding(
            severity=Severity.OK,
            check="imex",
            message="nvidia-imex runs with channel(s) " + ", ".join(str(c) for c in imex.channels),
        )
    ]
