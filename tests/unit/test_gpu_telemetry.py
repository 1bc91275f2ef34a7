"""GPU telemetry: nvidia-smi's XML on the machine fixtures, NVML through a fake of pynvml's
module API, and the order the two are tried in. No GPU anywhere."""

from dataclasses import dataclass, field
from typing import Any

import pytest

from activities.agent.gpu_telemetry import (
    GpuSample,
    NvmlTelemetry,
    parse_telemetry_xml,
    read_smi_telemetry,
    read_telemetry,
)
from activities.agent.nvml_source import CommandResult, GpuToolFailed, GpuToolMissing
from tests.machine_tools import MACHINES

MIB = 1024 * 1024


def machine(name: str) -> list[GpuSample]:
    return parse_telemetry_xml((MACHINES / name / "nvidia_smi_q_x.xml").read_text())


def test_a_busy_h100_reads_as_the_tool_printed_it() -> None:
    samples = machine("h100_sxm_x8")
    assert [s.index for s in samples] == list(range(8))
    busy = samples[0]
    assert busy.utilization_pct == 97.0
    assert (busy.memory_used_mb, busy.memory_total_mb) == (71250, 81559)
    assert busy.temperature_c == 31.0
    assert (busy.power_w, busy.power_limit_w) == (71.52, 700.0)
    assert (busy.ecc_corrected, busy.ecc_uncorrected) == (0, 0)
    assert (busy.remap_pending, busy.remap_failed) == (False, False)
    # The driver printed N/A for retired pages (H100 remaps rows instead): unknown, not zero.
    assert busy.retired_pages_single_bit is None
    assert busy.retired_pages_double_bit is None


def test_wear_signals_on_a_card_with_ecc_errors() -> None:
    healthy, worn = machine("ecc_uncorrected")
    assert (healthy.ecc_uncorrected, healthy.remap_pending) == (0, False)
    # DRAM 2 + SRAM SEC-DED 1 uncorrectable; DRAM 4 correctable.
    assert (worn.ecc_corrected, worn.ecc_uncorrected) == (4, 3)
    assert (worn.remapped_rows_correctable, worn.remapped_rows_uncorrectable) == (0, 1)
    assert worn.remap_pending is True


def test_the_older_power_layout_and_a_board_without_ecc_counts() -> None:
    (l40s,) = machine("l40s_x1")
    assert (l40s.power_w, l40s.power_limit_w) == (35.11, 350.0)
    assert l40s.ecc_uncorrected is None  # no ecc_errors block in its dump
    assert l40s.remap_pending is None


def test_mig_instances_follow_their_card_with_their_own_memory() -> None:
    samples = machine("a100_80g_mig_3g40gb")
    assert [(s.index, s.parent) for s in samples] == [(0, None), (1000, 0), (1001, 0), (1, None)]
    card, first, second, _other = samples
    assert card.utilization_pct is None  # N/A in MIG mode
    assert (first.memory_used_mb, first.memory_total_mb) == (11891, 40192)
    assert (second.memory_used_mb, second.memory_total_mb) == (13, 40192)
    # Neither tool measures an instance's temperature or power: those stay on the card.
    assert first.temperature_c is None
    assert first.power_w is None
    assert card.temperature_c == 33.0


def _with_reasons(block: str) -> str:
    return (
        "<nvidia_smi_log><gpu id='0'><minor_number>0</minor_number>"
        f"<product_name>X</product_name><uuid>GPU-x</uuid>{block}</gpu></nvidia_smi_log>"
    )


@pytest.mark.parametrize(
    ("block", "prefix"),
    [
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),
    ],
)
def test_throttle_reasons_in_either_drivers_words(block: str, prefix: str) -> None:
    xml = _with_reasons(
        f"<{block}><{prefix}gpu_idle>Not Active</{prefix}gpu_idle>"
        f"<{prefix}sw_power_cap>Active</{prefix}sw_power_cap>"
        f"<{prefix}hw_thermal_slowdown>Not Active</{prefix}hw_thermal_slowdown>"
        f"<{prefix}sync_boost>N/A</{prefix}sync_boost></{block}>"
    )
    (sample,) = parse_telemetry_xml(xml)
    assert sample.throttle == {
        "gpu_idle": False,
        "sw_power_cap": True,
        "hw_thermal_slowdown": False,
    }


def test_entities_are_refused() -> None:
    with pytest.raises(ValueError, match="entities"):
        parse_telemetry_xml('<!DOCTYPE x [<!ENTITY a "b">]><nvidia_smi_log/>')


def test_nvidia_smi_missing_failing_and_unreadable() -> None:
    def answering(code: int, out: str = "", err: str = "") -> Any:
        return lambda _argv: CommandResult(code, out, err)

    with pytest.raises(GpuToolMissing):
        read_smi_telemetry(run=answering(127, err="No such file"))
    with pytest.raises(GpuToolFailed, match="exited 9: driver not loaded"):
        read_smi_telemetry(run=answering(9, err="driver not loaded"))
    with pytest.raises(GpuToolFailed, match="unreadable"):
        read_smi_telemetry(run=answering(0, out="<nvidia_smi_log>"))
    xml = (MACHINES / "h200_x1" / "nvidia_smi_q_x.xml").read_text()
    (h200,) = read_smi_telemetry(run=answering(0, out=xml))
    assert h200.memory_total_mb == 143771


# NVML ------------------------------------------------------------------------------------


class NVMLError(Exception):
    pass


@dataclass
class Memory:
    total: int
    used: int


@dataclass
class Utilization:
    gpu: int
    memory: int = 0


@dataclass
class Card:
    name: str
    uuid: str
    memory: Memory
    util: int | None = 50
    temp: int = 60
    power_mw: int | None = 250_000
    limit_mw: int = 700_000
    ecc: tuple[int, int] | None = (5, 0)  # corrected, uncorrected; None: not supported
    retired: tuple[int, int] = (0, 0)
    remapped: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    reasons: int = 0
    migs: dict[int, "Card"] = field(default_factory=dict)
    mig_mode: int | None = None


class FakeNvml:
    """The slice of pynvml's module API that NvmlTelemetry calls."""

    NVMLError = NVMLError
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_VOLATILE_ECC = 0
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1

    def __init__(self, cards: list[Card], init_error: str = "") -> None:
        self.cards = cards
        self.init_error = init_error
        self.count_error = ""
        self.inits = 0
        self.shut_down = False

    def nvmlInit(self) -> None:
        if self.init_error:
            raise NVMLError(self.init_error)
        self.inits += 1
        self.shut_down = False

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        if self.count_error:
            raise NVMLError(self.count_error)
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Card:
        return self.cards[index]

    def nvmlDeviceGetName(self, c: Card) -> str:
        return c.name

    def nvmlDeviceGetUUID(self, c: Card) -> bytes:
        return c.uuid.encode()

    def nvmlDeviceGetMemoryInfo(self, c: Card) -> Memory:
        return c.memory

    def nvmlDeviceGetUtilizationRates(self, c: Card) -> Utilization:
        if c.util is None:
            raise NVMLError("Not Supported")
        return Utilization(c.util)

    def nvmlDeviceGetTemperature(self, c: Card, sensor: int) -> int:
        return c.temp

    def nvmlDeviceGetPowerUsage(self, c: Card) -> int:
        if c.power_mw is None:
            raise NVMLError("Not Supported")
        return c.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, c: Card) -> int:
        return c.limit_mw

    def nvmlDeviceGetTotalEccErrors(self, c: Card, kind: int, counter: int) -> int:
        if c.ecc is None:
            raise NVMLError("Not Supported")
        return c.ecc[kind]

    def nvmlDeviceGetRetiredPages(self, c: Card, cause: int) -> list[int]:
        return [0x1000 * i for i in range(c.retired[cause])]

    def nvmlDeviceGetRemappedRows(self, c: Card) -> tuple[int, int, int, int]:
        if c.remapped is None:
            raise NVMLError("Not Supported")
        return c.remapped

    def nvmlDeviceGetCurrentClocksEventReasons(self, c: Card) -> int:
        return c.reasons

    def nvmlDeviceGetMigMode(self, c: Card) -> tuple[int, int]:
        if c.mig_mode is None:
            raise NVMLError("Not Supported")
        return (c.mig_mode, c.mig_mode)

    def nvmlDeviceGetMaxMigDeviceCount(self, c: Card) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, c: Card, index: int) -> Card:
        if index not in c.migs:
            raise NVMLError("Not Found")
        return c.migs[index]


def test_nvml_reads_every_figure_and_shuts_down() -> None:
    card = Card(
        "NVIDIA H100 80GB HBM3",
        "GPU-a",
        Memory(80 * 1024 * MIB, 20 * 1024 * MIB),
        ecc=(5, 1),
        retired=(2, 1),
        remapped=(3, 1, 1, 0),
        reasons=0x4 | 0x40,  # SW power cap, HW thermal slowdown
    )
    nvml = FakeNvml([card])
    reader = NvmlTelemetry(nvml)
    (sample,) = reader.read()
    assert sample.utilization_pct == 50.0
    assert (sample.memory_used_mb, sample.memory_total_mb) == (20 * 1024, 80 * 1024)
    assert (sample.power_w, sample.power_limit_w) == (250.0, 700.0)
    assert (sample.ecc_corrected, sample.ecc_uncorrected) == (5, 1)
    assert (sample.retired_pages_single_bit, sample.retired_pages_double_bit) == (2, 1)
    assert (sample.remapped_rows_correctable, sample.remapped_rows_uncorrectable) == (3, 1)
    assert (sample.remap_pending, sample.remap_failed) == (True, False)
    assert {r for r, active in sample.throttle.items() if active} == {
        "sw_power_cap",
        "hw_thermal_slowdown",
    }
    # Initialised once, kept for the next reading, shut down when the agent stops.
    reader.read()
    assert (nvml.inits, nvml.shut_down) == (1, False)
    reader.close()
    assert nvml.shut_down


def test_nvml_is_initialised_afresh_after_a_failure() -> None:
    card = Card("NVIDIA H100 80GB HBM3", "GPU-a", Memory(80 * 1024 * MIB, 0))
    nvml = FakeNvml([card])
    reader = NvmlTelemetry(nvml)
    reader.read()
    nvml.count_error = "GPU is lost"
    with pytest.raises(GpuToolFailed, match="GPU is lost"):
        reader.read()
    assert nvml.shut_down
    nvml.count_error = ""
    assert [s.uuid for s in reader.read()] == ["GPU-a"]
    assert nvml.inits == 2


def test_nvml_leaves_out_what_a_board_does_not_support() -> None:
    card = Card("NVIDIA GeForce RTX 4090", "GPU-g", Memory(24 * 1024 * MIB, 0))
    card.ecc, card.remapped, card.power_mw, card.util = None, None, None, None
    (sample,) = NvmlTelemetry(FakeNvml([card])).read()
    assert sample.ecc_uncorrected is None
    assert sample.remapped_rows_correctable is None
    assert sample.power_w is None
    assert sample.utilization_pct is None
    assert sample.temperature_c == 60.0


def test_nvml_mig_instances_are_numbered_as_discovery_numbers_them() -> None:
    mig = Card("NVIDIA A100-SXM4-80GB MIG 3g.40gb", "MIG-1", Memory(40192 * MIB, 11891 * MIB))
    card = Card("NVIDIA A100-SXM4-80GB", "GPU-p", Memory(81920 * MIB, 0), util=None, migs={2: mig})
    card.mig_mode = 1
    samples = NvmlTelemetry(FakeNvml([card])).read()
    assert [(s.index, s.parent, s.uuid) for s in samples] == [
        (0, None, "GPU-p"),
        (1002, 0, "MIG-1"),
    ]
    assert samples[1].memory_used_mb == 11891


def test_nvml_unavailable_is_missing_not_failed() -> None:
    with pytest.raises(GpuToolMissing, match="NVML unavailable"):
        NvmlTelemetry(FakeNvml([], init_error="Driver Not Loaded")).read()


def test_nvml_first_then_nvidia_smi() -> None:
    one = [GpuSample(index=0, uuid="GPU-a", name="a")]

    def missing() -> list[GpuSample]:
        raise GpuToolMissing("no NVML")

    def failing() -> list[GpuSample]:
        raise GpuToolFailed("NVML failed: Unknown Error")

    assert read_telemetry(lambda: one, missing).source == "nvml"
    assert read_telemetry(missing, lambda: one).source == "nvidia-smi"
    fell_back = read_telemetry(failing, lambda: one)
    assert (fell_back.source, fell_back.samples) == ("nvidia-smi", one)
    nothing = read_telemetry(missing, missing)
    assert (nothing.source, nothing.samples, nothing.problem) == ("none", [], "")
    broken = read_telemetry(failing, failing)
    assert broken.source == "none"
    assert "Unknown Error" in broken.problem
