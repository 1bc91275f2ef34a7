"""Every machine fixture recorded by `make gpu-check` (a directory of tests/fixtures/machines
with a discovery.json): loaded as the machine tests load fixtures, discovery gives what it found
on the machine live; where NVML was recorded too, NVML and nvidia-smi agree on each card.

Reconstructed fixtures have no discovery.json and are not here; a recording committed from a
real machine joins these tests by being committed (docs/gpu-check.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tests.unit.test_doctor_on_fixtures as on_fixtures
from activities.agent.gpu_telemetry import GpuSample, parse_telemetry_xml
from bench.gpu_check.fixture_loader import discover_fixture
from bench.gpu_check.gpu_steps import card_disagreements, sample_disagreements
from bench.gpu_check.recorder import DISCOVERY_FILE, fixture_view, read_expected, read_meta
from tests.machine_tools import MACHINES
from workflows.contracts import GpuInfo

RECORDED = sorted(p.parent.name for p in MACHINES.glob(f"*/{DISCOVERY_FILE}"))
WITH_NVML = [name for name in RECORDED if (MACHINES / name / "nvml_report.json").is_file()]


def test_a_recording_of_a_real_machine_is_committed() -> None:
    # At least this CPU machine's; the parametrized tests below would otherwise test nothing.
    assert RECORDED


@pytest.mark.parametrize("name", RECORDED)
def test_the_recorded_machine_discovers_as_it_did_live(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = MACHINES / name
    meta = read_meta(root)
    expected = read_expected(root)
    inventory = on_fixtures.discovered(
        name,
        meta["address"],
        tmp_path,
        monkeypatch,
        arch=meta["arch"],
        imex=bool(meta["nvidia_imex_installed"]),
    )
    assert fixture_view(inventory) == expected
    assert fixture_view(discover_fixture(root, name)) == expected


@pytest.mark.parametrize("name", WITH_NVML)
def test_nvml_and_nvidia_smi_agree_on_the_recorded_cards(name: str) -> None:
    root = MACHINES / name
    smi = [GpuInfo.model_validate(g) for g in read_expected(root)["gpus"]]
    nvml_report = json.loads((root / "nvml_report.json").read_text())
    nvml = [GpuInfo.model_validate(g) for g in nvml_report["gpus"]]
    assert card_disagreements(smi, nvml) == []
    samples = [GpuSample(**s) for s in json.loads((root / "nvml_telemetry.json").read_text())]
    xml = (root / "nvidia_smi_q_x.xml").read_text()
    assert sample_disagreements(parse_telemetry_xml(xml), samples) == []
