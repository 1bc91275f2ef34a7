"""Shared by the discovery and doctor tests: the tools discovery runs, answering from a machine
fixture, and `llmgw doctor` run as the operator runs it on given facts."""

import argparse
from pathlib import Path

import pytest

import workers.doctor
from activities.agent.doctor.facts import DoctorFacts
from activities.agent.doctor.findings import Finding

MACHINES = Path(__file__).resolve().parent / "fixtures" / "machines"


def write_tool(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def recorded_nvidia_smi(directory: Path, root: Path) -> None:
    """An nvidia-smi that answers each command discovery runs with that machine's recording."""
    write_tool(
        directory / "nvidia-smi",
        f'case "$*" in\n'
        f'  "-q -x") cat "{root}/nvidia_smi_q_x.xml" ;;\n'
        f'  "-L") cat "{root}/nvidia_smi_L.txt" ;;\n'
        f'  "--query-gpu=index,compute_cap --format=csv,noheader") '
        f'cat "{root}/nvidia_smi_compute_cap.csv" ;;\n'
        f'  "topo -m") cat "{root}/nvidia_smi_topo_m.txt" ;;\n'
        f"  *) exit 9 ;;\n"
        f"esac\n",
    )


def run_doctor(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    facts: DoctorFacts,
    *argv: str,
) -> tuple[int, str]:
    """`llmgw doctor` as the operator runs it, on these facts: its exit status and output."""
    monkeypatch.setattr(workers.doctor, "gather_facts", lambda *_args, **_kw: facts)
    parser = argparse.ArgumentParser()
    workers.doctor.add_arguments(parser)
    code = workers.doctor.run(parser.parse_args(list(argv)))
    return code, capsys.readouterr().out


def by_check(findings: list[Finding], check: str) -> list[Finding]:
    return [f for f in findings if f.check == check]
