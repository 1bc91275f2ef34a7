"""What `llmgw doctor` prints: the text an operator reads, and the JSON they send back. Pure."""

from __future__ import annotations

import json
from collections import Counter

from activities.agent.doctor.facts import DoctorFacts
from activities.agent.doctor.findings import Finding, Severity
from engines.nccl_env import FabricKind, available_fabrics, nccl_env


def summary(facts: DoctorFacts) -> str:
    """One line: the node and what it has."""
    inv = facts.inventory
    parts = [f"node {inv.name} ({inv.address})"]
    cards = [g for g in inv.gpus if g.mig is None]
    instances = [g for g in inv.gpus if g.mig is not None]
    if inv.gpus:
        names = Counter(g.name for g in cards)
        gpu_text = ", ".join(f"{n} x {name}" for name, n in names.items())
        if instances:
            parents = len({g.mig.parent_index for g in instances if g.mig is not None})
            mig = f"{len(instances)} MIG instance(s) on {parents} card(s)"
            gpu_text = f"{gpu_text}, {mig}" if gpu_text else mig
        parts.append(gpu_text)
        parts.append(f"driver {inv.nvidia_driver or '?'}, CUDA {inv.cuda_version or '?'}")
    else:
        parts.append("no NVIDIA GPU")
    if inv.nvswitch:
        parts.append("NVSwitch")
    if inv.network_ports:
        kinds = Counter("RoCE" if p.kind == "roce" else "IB" for p in inv.network_ports)
        parts.append(", ".join(f"{n} {kind} port(s)" for kind, n in sorted(kinds.items())))
    cpu = f"{inv.cpu_cores} CPUs" + (f" {inv.cpu_model}" if inv.cpu_model else "")
    parts.append(f"{cpu}, {inv.memory_mb // 1024} GiB")
    return ": ".join(parts[:2]) + ("; " + "; ".join(parts[2:]) if parts[2:] else "")


def environments(facts: DoctorFacts) -> dict[FabricKind, dict[str, str]]:
    """The NCCL environment a shard would be given on each fabric this node can use."""
    return {kind: nccl_env(facts.inventory, kind) for kind in available_fabrics(facts.inventory)}


def render_text(facts: DoctorFacts, findings: list[Finding]) -> str:
    lines = [summary(facts), ""]
    for finding in findings:
        lines.append(f"{finding.severity.value.upper():<5} {finding.check}: {finding.message}")
        if finding.fix and finding.severity != Severity.OK:
            lines.append(f"      fix: {finding.fix}")
    counts = Counter(f.severity for f in findings)
    lines += [
        "",
        ", ".join(f"{counts[s]} {s.value}" for s in Severity),
        "",
    ]
    for kind, env in environments(facts).items():
        lines.append(f"NCCL environment for a shard over {kind}:")
        lines += [f"  {name}={value}" for name, value in env.items()]
    return "\n".join(lines) + "\n"


def render_json(facts: DoctorFacts, findings: list[Finding]) -> str:
    document = {
        "facts": facts.model_dump(mode="json"),
        "findings": [f.model_dump(mode="json") for f in findings],
        "nccl_env": environments(facts),
    }
    return json.dumps(document, indent=2) + "\n"
