"""Checks of the NVIDIA driver and each GPU: nvidia-smi, versions, ECC, MIG, other processes."""

from __future__ import annotations

from activities.agent.doctor.facts import DoctorFacts
from activities.agent.doctor.findings import Finding, Severity
from workflows.contracts import ENGINE_FACTS, GpuInfo
from workflows.contracts.cuda_builds import cuda_shortfall


def card(gpu: GpuInfo) -> int:
    """The physical card a GPU entry is on: a MIG instance names its parent."""
    return gpu.mig.parent_index if gpu.mig is not None else gpu.index


def cards(indices: list[int]) -> str:
    """Names cards for a message: "GPU 3" or "GPUs 0, 1, 5"."""
    unique = sorted(set(indices))
    if len(unique) == 1:
        return f"GPU {unique[0]}"
    return "GPUs " + ", ".join(str(i) for i in unique)


def are(indices: list[int]) -> str:
    return "is" if len(set(indices)) == 1 else "are"


def _smi_fix(output: str, kernel: str) -> str:
    text = output.lower()
    if "version mismatch" in text:
        return (
            "the driver was upgraded but the old kernel module is still loaded: reboot the "
            "node (or stop everything using the GPUs and reload the nvidia modules)"
        )
    if "couldn't communicate" in text or "not loaded" in text:
        return (
            "load the driver: `sudo modprobe nvidia`; if that fails, its module was not built "
            f"for kernel {kernel or '$(uname -r)'}: `sudo dkms autoinstall` or reinstall the "
            "driver package, then reboot"
        )
    if "did not finish" in text:
        return (
            "nvidia-smi hangs, usually a GPU that fell off the bus: read `sudo dmesg | grep -i "
            "-e xid -e nvrm`, drain the node and reboot it"
        )
    return "run `nvidia-smi` by hand and read `sudo dmesg | grep -i -e xid -e nvrm`"


def driver_checks(facts: DoctorFacts) -> list[Finding]:
    inv = facts.inventory
    smi = facts.nvidia_smi
    findings: list[Finding] = []
    last_line = smi.output.strip().splitlines()[-1] if smi.output.strip() else ""
    smi_failed = smi.found and smi.exit_code != 0
    if smi_failed and "no devices were found" in smi.output.lower():
        findings.append(
            Finding(
                severity=Severity.WARN,
                check="nvidia-smi",
                message="the NVIDIA driver is installed but sees no GPU",
                fix="check the card is attached (`lspci | grep -i nvidia`); in a VM, check the "
                "PCI passthrough",
            )
        )
    elif smi_failed:
        exit_text = "did not finish" if smi.exit_code is None else f"exited {smi.exit_code}"
        findings.append(
            Finding(
                severity=Severity.FAIL,
                check="nvidia-smi",
                message=f"nvidia-smi is installed but fails ({exit_text}): {last_line}; this "
                "node's GPUs cannot be used",
                fix=_smi_fix(smi.output, inv.kernel),
            )
        )
    elif facts.nvidia_driver_loaded and not smi.found:
        findings.append(
            Finding(
                severity=Severity.FAIL,
                check="nvidia-smi",
                message="the NVIDIA driver is loaded but nvidia-smi is not installed, so llmgw "
                "cannot see the GPUs",
                fix="install the driver's utilities (Ubuntu: nvidia-utils-<driver branch>)",
            )
        )
    for problem in inv.problems:
        if smi_failed and "nvidia-smi" in problem:
            continue  # already said above, with its fix
        findings.append(
            Finding(
                severity=Severity.WARN,
                check="discovery",
                message=f"discovery could not finish: {problem}",
                fix="see the message; `llmgw doctor --json` shows what was found",
            )
        )
    if not inv.gpus and not smi.found and not facts.nvidia_driver_loaded:
        findings.append(
            Finding(
                severity=Severity.INFO,
                check="gpus",
                message="CPU node: no NVIDIA GPU (no driver loaded, no nvidia-smi); engines "
                "run on the CPU",
            )
        )
    if inv.nvidia_driver:
        findings.append(
            Finding(
                severity=Severity.INFO,
                check="driver",
                message=f"NVIDIA driver {inv.nvidia_driver}, CUDA {inv.cuda_version or 'unknown'}",
            )
        )
        findings.extend(_cuda_too_old(facts))
    return findings


def _cuda_too_old(facts: DoctorFacts) -> list[Finding]:
    """Each engine here whose builds need a newer driver or newer GPUs than the node has, as
    its version's row says (workflows/contracts/cuda_builds.py). A GPU node with no engine yet
    is judged for every CUDA engine at its oldest builds: what it could be given at all."""
    inv = facts.inventory
    usable = [gpu.compute_capability for gpu in inv.gpus if not gpu.unusable]
    installed = [(e.engine, e.version) for e in facts.engines]
    if not any(ENGINE_FACTS[e].cuda_builds for e, _ in installed if e in ENGINE_FACTS):
        installed = [(name, "") for name, row in ENGINE_FACTS.items() if row.cuda_builds]
    findings: list[Finding] = []
    for engine, version in sorted(installed):
        row = ENGINE_FACTS.get(engine)
        if row is None or not inv.gpus:
            continue
        short = cuda_shortfall(
            row.title, version, row.cuda_builds, inv.nvidia_driver or "", inv.cuda_version, usable
        )
        if short is not None:
            findings.append(
                Finding(
                    severity=Severity.WARN,
                    check="cuda-version",
                    message=short.message,
                    fix=short.fix,
                )
            )
    return findings


def gpu_checks(facts: DoctorFacts) -> list[Finding]:
    findings: list[Finding] = []
    gpus = facts.inventory.gpus
    seen_ecc: set[int] = set()
    for gpu in gpus:
        index = card(gpu)
        if gpu.ecc_uncorrected > 0 and index not in seen_ecc:
            seen_ecc.add(index)
            findings.append(
                Finding(
                    severity=Severity.FAIL,
                    check="gpu-ecc",
                    message=f"GPU {index} ({gpu.uuid}) has {gpu.ecc_uncorrected} uncorrected "
                    "ECC errors since the driver loaded: its memory cannot be trusted and "
                    "placement leaves it out",
                    fix=f"drain the node, then reset the card (`sudo nvidia-smi -r -i {index}`) "
                    "or reboot; if errors come back, `nvidia-smi -q -d ECC,ROW_REMAPPER` and "
                    "replace the card",
                )
            )
    findings.extend(_mig_checks(gpus))
    findings.extend(_held_by_others(facts))
    off = [i for i, enabled in sorted(facts.persistence_mode.items()) if not enabled]
    if off:
        findings.append(
            Finding(
                severity=Severity.INFO,
                check="persistence-mode",
                message=f"persistence mode is off on {cards(off)}: the driver tears down and "
                "re-initialises the cards around every engine start (seconds each)",
                fix="`sudo systemctl enable --now nvidia-persistenced` (or `sudo nvidia-smi "
                "-pm 1`)",
            )
        )
    return findings


def _mig_checks(gpus: list[GpuInfo]) -> list[Finding]:
    findings: list[Finding] = []
    instances: dict[int, list[str]] = {}
    for gpu in gpus:
        if gpu.mig is not None:
            instances.setdefault(gpu.mig.parent_index, []).append(gpu.mig.profile)
    for parent, profiles in sorted(instances.items()):
        findings.append(
            Finding(
                severity=Severity.INFO,
                check="mig",
                message=f"GPU {parent} is in MIG mode with {len(profiles)} instance(s): "
                + ", ".join(sorted(profiles)),
            )
        )
    for gpu in gpus:
        reason = gpu.unusable
        if not reason or gpu.ecc_uncorrected > 0:
            continue  # ECC has its own finding
        if gpu.mig is None and "mig" in reason.lower():
            findings.append(
                Finding(
                    severity=Severity.WARN,
                    check="mig",
                    message=f"GPU {gpu.index} is in MIG mode with no instances carved: nothing "
                    "can run on it",
                    fix=f"carve instances (`sudo nvidia-smi mig -i {gpu.index} -lgip` lists the "
                    f"profiles; `sudo nvidia-smi mig -i {gpu.index} -cgi <profile> -C`), or "
                    f"leave MIG mode: `sudo nvidia-smi -i {gpu.index} -mig 0` and reset the card",
                )
            )
        else:
            findings.append(
                Finding(
                    severity=Severity.WARN,
                    check="gpu-unusable",
                    message=f"GPU {gpu.index} cannot be placed on: {reason}",
                    fix="see the reason; `nvidia-smi -q -i " + str(card(gpu)) + "` shows more",
                )
            )
    return findings


def _held_by_others(facts: DoctorFacts) -> list[Finding]:
    ours = set(facts.engine_pids)
    findings = []
    for gpu in facts.inventory.gpus:
        others = [p for p in gpu.processes if p.pid not in ours]
        if not others:
            continue
        holders = ", ".join(
            f"pid {p.pid} ({p.name or '?'}, {p.used_memory_mb} MiB)" for p in others
        )
        findings.append(
            Finding(
                severity=Severity.WARN,
                check="gpu-processes",
                message=f"GPU {gpu.index} is held by processes llmgw did not start: {holders}; "
                "their memory is not free for engines",
                fix="stop them (`nvidia-smi` names them), or cordon the node while they run",
            )
        )
    return findings
