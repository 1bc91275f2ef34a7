"""diagnose: every check over the facts, most serious first. Pure."""

from __future__ import annotations

from activities.agent.doctor.fabric_checks import (
    fabric_manager_checks,
    imex_checks,
    nvlink_fabric_checks,
)
from activities.agent.doctor.facts import DoctorFacts
from activities.agent.doctor.findings import Finding, Severity, most_serious_first
from activities.agent.doctor.gpu_checks import driver_checks, gpu_checks
from activities.agent.doctor.host_checks import cpu_checks, engine_checks, memlock_checks
from activities.agent.doctor.network_checks import (
    management_interface_checks,
    port_checks,
    rdma_module_checks,
    roce_gid_checks,
)

# In the order a node is brought up, which is the order findings of one severity are shown in:
# a driver that does not load explains everything after it.
CHECKS = (
    driver_checks,
    gpu_checks,
    fabric_manager_checks,
    nvlink_fabric_checks,
    imex_checks,
    rdma_module_checks,
    port_checks,
    roce_gid_checks,
    memlock_checks,
    management_interface_checks,
    cpu_checks,
    engine_checks,
)


def diagnose(facts: DoctorFacts) -> list[Finding]:
    findings: list[Finding] = []
    for check in CHECKS:
        findings.extend(check(facts))
    return most_serious_first(findings)


def failed(findings: list[Finding]) -> bool:
    return any(f.severity == Severity.FAIL for f in findings)
