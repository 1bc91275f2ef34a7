"""Checks of the host around the GPUs: the agent's memlock limit, the CPU, the engines."""

from __future__ import annotations

from activities.agent.doctor.facts import DoctorFacts, EngineCheck
from activities.agent.doctor.findings import Finding, Severity

X86 = {"x86_64", "amd64", "i386", "i686"}
MEMLOCK_FIX = (
    "LimitMEMLOCK=infinity in the agent's systemd unit (deploy/systemd/llmgw-agent.service has "
    "it), then `sudo systemctl daemon-reload && sudo systemctl restart llmgw-agent`; started by "
    "hand, run `ulimit -l unlimited` first (raise the hard limit in /etc/security/limits.d/ if "
    "refused); in a container, `--ulimit memlock=-1`"
)


def _size(limit: int | None) -> str:
    if limit is None:
        return "unlimited"
    if limit >= 1 << 20:
        return f"{limit / (1 << 20):g} MiB"
    return f"{limit / 1024:g} KiB"


def memlock_checks(facts: DoctorFacts) -> list[Finding]:
    limit = facts.memlock
    if limit is None:
        return []
    if limit.unlimited:
        return [
            Finding(
                severity=Severity.OK,
                check="memlock",
                message=f"the memlock limit of {limit.source} is unlimited",
            )
        ]
    if facts.inventory.network_ports:
        return [
            Finding(
                severity=Severity.FAIL,
                check="memlock",
                message=f"the memlock limit of {limit.source} is {_size(limit.soft_bytes)}; "
                "engines inherit it, and NCCL over RDMA pins its buffers: "
                "multi-node jobs fail with 'Cannot allocate memory' or hang",
                fix=MEMLOCK_FIX,
            )
        ]
    return [
        Finding(
            severity=Severity.INFO,
            check="memlock",
            message=f"the memlock limit of {limit.source} is {_size(limit.soft_bytes)}: "
            "harmless without RDMA, but llama-server's --mlock fails for any model bigger",
            fix=MEMLOCK_FIX,
        )
    ]


def cpu_checks(facts: DoctorFacts) -> list[Finding]:
    inv = facts.inventory
    if inv.arch.lower() not in X86:
        return []
    if "avx2" in inv.cpu_flags:
        return [Finding(severity=Severity.OK, check="avx2", message="the CPU has AVX2")]
    model = f" ({inv.cpu_model})" if inv.cpu_model else ""
    return [
        Finding(
            severity=Severity.WARN,
            check="avx2",
            message=f"the CPU{model} reports no AVX2: llama.cpp's CPU builds run several times "
            "slower and nothing else looks wrong. In a VM the usual cause is a generic virtual "
            "CPU type that hides the host's instructions",
            fix="give the VM the host's CPU type (libvirt: <cpu mode='host-passthrough'/>; "
            "Proxmox: cpu: host; VMware: lower the EVC mode's cap), or keep CPU models off "
            "this node",
        )
    ]


def _engine_finding(check: EngineCheck, others_ok: bool) -> Finding:
    name = f"{check.engine} {check.version}".strip()
    if not check.marker:
        return Finding(
            # A newer version of the same engine that runs makes a leftover directory harmless.
            severity=Severity.WARN if others_ok else Severity.FAIL,
            check="engine",
            message=f"{name} is not installed: {check.detail} ({check.path})",
            fix="the agent retries its installs; `journalctl -u llmgw-agent` or the node's "
            "engine list (`llmgw nodes`) says why it failed",
        )
    if check.runnable is False and "needs an NVIDIA GPU" in check.detail:
        # No library will fix it (SGLang without a CPU build, reverify_installed).
        return Finding(
            severity=Severity.FAIL,
            check="engine",
            message=f"{name} is installed but cannot run here: {check.detail}",
            fix=f"run {check.engine} on a node with an NVIDIA GPU and keep it off this one "
            f"(an `engines:` override with `disabled: true`, or `--disable-engine "
            f"{check.engine}` when adding the node), then remove {check.path}",
        )
    if check.runnable is False:
        return Finding(
            severity=Severity.FAIL,
            check="engine",
            message=f"{name} is installed but cannot run: {check.detail}",
            fix="install what it lacks (a missing library names its package, e.g. libgomp1), "
            "then restart the agent so it verifies again; or remove the directory to reinstall",
        )
    if check.runnable is None:
        return Finding(
            severity=Severity.INFO,
            check="engine",
            message=f"{name} is installed at {check.path}; {check.detail}",
        )
    return Finding(severity=Severity.OK, check="engine", message=f"{name} runs: {check.detail}")


def engine_checks(facts: DoctorFacts) -> list[Finding]:
    if not facts.engines:
        where = f"{facts.state_dir}/engines" if facts.state_dir else "the state dir"
        return [
            Finding(
                severity=Severity.FAIL,
                check="engine",
                message=f"no engine is installed under {where}: this node can serve nothing",
                fix="start the agent (`llmgw agent`), which installs the cluster's engines; or "
                "name a binary: `llmgw agent --engine-path llamacpp=/path/to/llama-server`; "
                "a different state dir: `llmgw doctor --state-dir DIR`",
            )
        ]
    runnable = {c.engine for c in facts.engines if c.marker and c.runnable}
    return [_engine_finding(c, c.engine in runnable) for c in facts.engines]
