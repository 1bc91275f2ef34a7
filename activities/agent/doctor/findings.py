"""What the doctor says: one finding per thing checked, most serious first."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel


class Severity(StrEnum):
    FAIL = "fail"  # something will not work until fixed: `llmgw doctor` exits 1
    WARN = "warn"  # works, but slower, partly, or not for long
    INFO = "info"  # worth knowing; nothing to fix
    OK = "ok"  # checked and fine


RANK = {Severity.FAIL: 0, Severity.WARN: 1, Severity.INFO: 2, Severity.OK: 3}


class Finding(BaseModel):
    severity: Severity
    check: str  # a stable id: "fabric-manager", "roce-gid", ...
    message: str  # in plain words, naming the GPU, port or engine concerned
    fix: str = ""  # the command or action that fixes it; empty for ok and info


def most_serious_first(findings: list[Finding]) -> list[Finding]:
    # sorted() is stable: within one severity the checks keep their order, which follows the
    # order a node is brought up in (driver, GPUs, fabric, network, host, engines).
    return sorted(findings, key=lambda finding: RANK[finding.severity])
