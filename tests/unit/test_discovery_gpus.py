"""GPUs by machine: what placement sees from each recorded nvidia-smi (-q -x, -L, compute_cap)."""

from pathlib import Path

from activities.agent.gpu_parsing import (
    NO_INSTANCES_CARVED,
    NvidiaSmiReport,
    parse_compute_caps,
    parse_nvidia_smi_list,
    parse_nvidia_smi_xml,
)

MACHINES = Path(__file__).resolve().parent.parent / "fixtures" / "machines"


def report(machine: str) -> NvidiaSmiReport:
    root = MACHINES / machine
    caps = root / "nvidia_smi_compute_cap.csv"
    return parse_nvidia_smi_xml(
        (root / "nvidia_smi_q_x.xml").read_text(),
        listed=parse_nvidia_smi_list((root / "nvidia_smi_L.txt").read_text()),
        compute_caps=parse_compute_caps(caps.read_text()) if caps.exists() else None,
    )


def test_classes_by_machine() -> None:
    classes = {
        m: sorted({g.gpu_class for g in report(m).gpus})
        for m in ("h100_sxm_x8", "h200_x1", "l40s_x1", "gb200_nvl72_tray")
    }
    assert classes == {
        "h100_sxm_x8": ["h100-80g"],
        "h200_x1": ["h200-140g"],
        "l40s_x1": ["l40s-45g"],
        "gb200_nvl72_tray": ["gb200-185g"],
    }


def test_compute_capability_comes_from_the_compute_cap_query() -> None:
    assert {g.compute_capability for g in report("h100_sxm_x8").gpus} == {"9.0"}
    assert report("l40s_x1").gpus[0].compute_capability == "8.9"
    assert {g.compute_capability for g in report("gb200_nvl72_tray").gpus} == {"10.0"}


def test_h100_memory_in_use_and_the_process_holding_it() -> None:
    busy = report("h100_sxm_x8").gpus[0]
    assert busy.memory_used_mb == 71250
    (process,) = busy.processes
    assert (process.pid, process.name, process.used_memory_mb) == (
        318204,
        "/usr/bin/python3",
        71244,
    )
    assert report("h100_sxm_x8").gpus[1].processes == []


def test_a100_mig_card_is_reported_as_its_instances() -> None:
    parsed = report("a100_80g_mig_3g40gb")
    first, second, _uncarved = parsed.gpus
    assert [first.index, second.index] == [1000, 1001]
    assert first.uuid == "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f"
    assert second.uuid == "MIG-4bd4a1a0-2b08-5c8e-9a54-1e0f9a6b33d7"
    assert first.gpu_class == second.gpu_class == "a100-80g-mig-3g.40gb"
    assert first.memory_mb == 40192
    assert first.unusable == second.unusable == ""
    assert first.mig is not None
    assert first.mig.parent_index == 0
    assert first.mig.parent_uuid == "GPU-0cb1e29c-658c-da14-95e6-0af593bd04cf"
    assert (first.mig.profile, first.mig.gpu_instance_id, first.mig.compute_instance_id) == (
        "3g.40gb",
        1,
        0,
    )
    # The process runs in GPU instance 1: it belongs to that slice, not the other.
    assert [p.pid for p in first.processes] == [220417]
    assert second.processes == []
    assert first.compute_capability == "8.0"


def test_a100_card_in_mig_mode_with_nothing_carved_is_unusable_with_the_reason() -> None:
    uncarved = report("a100_80g_mig_3g40gb").gpus[-1]
    assert uncarved.index == 1
    assert uncarved.mig is None
    assert uncarved.gpu_class == "a100-80g"
    assert uncarved.unusable == NO_INSTANCES_CARVED
    cards = report("a100_80g_mig_3g40gb").cards
    assert [(c.mig_current, c.mig_instances) for c in cards] == [("Enabled", 2), ("Enabled", 0)]


def test_mig_instance_without_an_nvidia_smi_L_listing_cannot_be_placed() -> None:
    xml = (MACHINES / "a100_80g_mig_3g40gb" / "nvidia_smi_q_x.xml").read_text()
    first = parse_nvidia_smi_xml(xml).gpus[0]
    assert first.uuid == ""
    assert "UUID unknown" in first.unusable


def test_card_with_uncorrected_ecc_errors_is_unusable_with_the_count() -> None:
    healthy, broken = report("ecc_uncorrected").gpus
    assert healthy.unusable == ""
    assert healthy.ecc_uncorrected == 0
    # 2 DRAM + 1 SRAM (SEC-DED) volatile uncorrectable errors.
    assert broken.ecc_uncorrected == 3
    assert broken.unusable.startswith("3 uncorrected ECC errors")


def test_gb200_tray_is_joined_to_one_nvlink_domain() -> None:
    gpus = report("gb200_nvl72_tray").gpus
    assert len(gpus) == 4
    domains = set()
    for gpu in gpus:
        assert gpu.fabric is not None
        assert gpu.fabric.joined
        domains.add(gpu.fabric.domain)
    assert domains == {"6f4c1f3e-8a7b-4d2e-9c51-2b7e0d4a9f13/32766"}
    assert [g.fabric.bandwidth for g in gpus if g.fabric] == ["Full", "Full", "Full", "Degraded"]
    assert gpus[0].pci_bus_id == "00000008:01:00.0"


def test_h100_hgx_fabric_is_no_domain() -> None:
    # The HGX board's own NVSwitch: fabric Completed, but a cluster of zeros.
    fabric = report("h100_sxm_x8").gpus[0].fabric
    assert fabric is not None
    assert fabric.state == "Completed"
    assert fabric.domain is None
    assert not fabric.joined


def test_cards_without_a_fabric_report_none() -> None:
    assert report("h200_x1").gpus[0].fabric is None
    assert report("l40s_x1").gpus[0].fabric is None


def test_nvidia_smi_list_parses_cards_and_mig_devices() -> None:
    listed = parse_nvidia_smi_list(
        (MACHINES / "a100_80g_mig_3g40gb" / "nvidia_smi_L.txt").read_text()
    )
    assert [c.index for c in listed] == [0, 1]
    assert [(m.device, m.profile) for m in listed[0].migs] == [(0, "3g.40gb"), (1, "3g.40gb")]
    assert listed[1].migs == []


def test_compute_caps_ignores_unsupported_lines() -> None:
    assert parse_compute_caps("0, 9.0\n1, [N/A]\nbogus\n") == {0: "9.0"}
