"""What each GPU is doing now, and how worn it is: one `GpuSample` per card and per MIG
instance, read through NVML (nvidia-ml-py) or, where NVML cannot be loaded, from
`nvidia-smi -q -x`.

Discovery (gpu_parsing.py, nvml_source.py) answers what placement needs and changes rarely;
this answers what changes every second (utilisation, memory in use, temperature, power) and
the wear signals an operator watches (ECC counts, retired pages, remapped rows, why clocks are
held down). The XML parsing is pure and runs on the machine fixtures; the NVML reading takes a
pynvml-shaped module, so tests pass a fake.

A MIG instance reports only its memory: neither NVML nor nvidia-smi measures utilisation,
temperature or power per instance, so those stay on the card's own sample.
"""

from __future__ import annotations

import contextlib
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from activities.agent.gpu_parsing import _strip_doctype, mig_index
from activities.agent.nvml_source import (
    GpuToolFailed,
    GpuToolMissing,
    Runner,
    run_command,
)

_MIB = 1024 * 1024
_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")
# Clock-event reasons by NVML bit (nvmlClocksEventReason*), named as nvidia-smi's XML names
# them (clocks_event_reason_<name>; clocks_throttle_reason_<name> before R535).
THROTTLE_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clocks_setting",
}


@dataclass(frozen=True)
class GpuSample:
    """One card or MIG instance now. None: the tool did not say (N/A, not supported)."""

    index: int  # discovery's index: the card's, or 1000 + 100 x card + instance for MIG
    uuid: str
    name: str
    parent: int | None = None  # the card's index, for a MIG instance
    utilization_pct: float | None = None
    memory_used_mb: int | None = None
    memory_total_mb: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    ecc_corrected: int | None = None  # volatile: since the driver loaded
    ecc_uncorrected: int | None = None
    retired_pages_single_bit: int | None = None  # pages retired for repeated single-bit errors
    retired_pages_double_bit: int | None = None
    remapped_rows_correctable: int | None = None  # Ampere and later replace retired pages
    remapped_rows_uncorrectable: int | None = None
    remap_pending: bool | None = None  # a reset is needed to apply a remap
    remap_failed: bool | None = None
    # Every reason the tool reports, True where it holds clocks down now.
    throttle: dict[str, bool] = field(default_factory=dict)


# nvidia-smi's XML ------------------------------------------------------------------------


def _text(node: ET.Element | None, path: str) -> str:
    found = node.find(path) if node is not None else None
    return (found.text or "").strip() if found is not None else ""


def _number(value: str) -> float | None:
    """ "97 %", "33 C", "71.52 W", "81920 MiB" -> the number; "N/A", "" -> None."""
    match = _NUMBER.match(value)
    return float(match.group(1)) if match else None


def _int(value: str) -> int | None:
    number = _number(value)
    return int(number) if number is not None else None


def _first(node: ET.Element | None, *paths: str) -> float | None:
    for path in paths:
        number = _number(_text(node, path))
        if number is not None:
            return number
    return None


def _yes(value: str) -> bool | None:
    return {"yes": True, "no": False}.get(value.lower())


def _summed(volatile: ET.Element | None, names: tuple[str, ...]) -> int | None:
    """The sum of whichever of these counters the driver reports; None when it has none."""
    values = [_int(_text(volatile, name)) for name in names]
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _ecc(gpu: ET.Element) -> tuple[int | None, int | None]:
    """Volatile corrected and uncorrected counts, DRAM and SRAM together, across the layouts of
    R470 (single_bit/double_bit totals) to R550 (SRAM split into parity and SEC-DED)."""
    volatile = gpu.find("ecc_errors/volatile")
    corrected = _summed(volatile, ("dram_correctable", "sram_correctable"))
    uncorrected = _summed(
        volatile,
        (
            "dram_uncorrectable",
            "sram_uncorrectable",
            "sram_uncorrectable_parity",
            "sram_uncorrectable_secded",
        ),
    )
    if corrected is None:
        corrected = _int(_text(volatile, "single_bit/total"))
    if uncorrected is None:
        uncorrected = _int(_text(volatile, "double_bit/total"))
    return corrected, uncorrected


def _throttle(gpu: ET.Element) -> dict[str, bool]:
    reasons: dict[str, bool] = {}
    for block, prefix in (
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),
    ):
        for item in gpu.findall(f"{block}/*"):
            state = (item.text or "").strip()
            if item.tag.startswith(prefix) and state in ("Active", "Not Active"):
                reasons[item.tag.removeprefix(prefix)] = state == "Active"
    return reasons


def parse_telemetry_xml(text: str) -> list[GpuSample]:
    """Every card in `nvidia-smi -q -x`, each followed by its MIG instances."""
    root = ET.fromstring(_strip_doctype(text))  # noqa: S314 - local tool output, entities refused
    samples: list[GpuSample] = []
    for position, gpu in enumerate(root.findall("gpu")):
        minor = _text(gpu, "minor_number")
        index = int(minor) if minor.isdigit() else position  # as discovery numbers cards
        power = gpu.find("gpu_power_readings")
        if power is None:
            power = gpu.find("power_readings")  # before R530
        corrected, uncorrected = _ecc(gpu)
        remapped = gpu.find("remapped_rows")
        card = GpuSample(
            index=index,
            uuid=_text(gpu, "uuid"),
            name=_text(gpu, "product_name"),
            utilization_pct=_number(_text(gpu, "utilization/gpu_util")),
            memory_used_mb=_int(_text(gpu, "fb_memory_usage/used")),
            memory_total_mb=_int(_text(gpu, "fb_memory_usage/total")),
            temperature_c=_number(_text(gpu, "temperature/gpu_temp")),
            power_w=_first(power, "instant_power_draw", "power_draw", "average_power_draw"),
            power_limit_w=_first(
                power, "current_power_limit", "enforced_power_limit", "power_limit"
            ),
            ecc_corrected=corrected,
            ecc_uncorrected=uncorrected,
            retired_pages_single_bit=_int(
                _text(gpu, "retired_pages/multiple_single_bit_retirement/retired_count")
            ),
            retired_pages_double_bit=_int(
                _text(gpu, "retired_pages/double_bit_retirement/retired_count")
            ),
            remapped_rows_correctable=_int(_text(remapped, "remapped_row_corr")),
            remapped_rows_uncorrectable=_int(_text(remapped, "remapped_row_unc")),
            remap_pending=_yes(_text(remapped, "remapped_row_pending")),
            remap_failed=_yes(_text(remapped, "remapped_row_failure")),
            throttle=_throttle(gpu),
        )
        samples.append(card)
        for mig in gpu.findall("mig_devices/mig_device"):
            device = _int(_text(mig, "index")) or 0
            samples.append(
                GpuSample(
                    index=mig_index(index, device),
                    uuid="",  # only `nvidia-smi -L` names instances; discovery has them
                    name=f"{card.name} MIG device {device}",
                    parent=index,
                    memory_used_mb=_int(_text(mig, "fb_memory_usage/used")),
                    memory_total_mb=_int(_text(mig, "fb_memory_usage/total")),
                )
            )
    return samples


# NVML ------------------------------------------------------------------------------------


def _str(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _ask(nvml: Any, call: Callable[[], Any]) -> Any:
    """One NVML figure, or None where this board does not have it (NOT_SUPPORTED and the
    like): a GeForce has no ECC, a PCIe card may not report power."""
    try:
        return call()
    except nvml.NVMLError:
        return None


def _nvml_card(nvml: Any, handle: Any, index: int) -> GpuSample:
    def ask(call: Callable[[], Any]) -> Any:
        return _ask(nvml, call)

    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    utilization = ask(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
    power_mw = ask(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
    limit_mw = ask(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))

    def ecc(kind: int) -> int | None:
        count = ask(lambda: nvml.nvmlDeviceGetTotalEccErrors(handle, kind, nvml.NVML_VOLATILE_ECC))
        return int(count) if count is not None else None

    def retired(cause: int) -> int | None:
        pages = ask(lambda: nvml.nvmlDeviceGetRetiredPages(handle, cause))
        return len(pages) if pages is not None else None

    remapped = ask(lambda: nvml.nvmlDeviceGetRemappedRows(handle))
    # nvidia-ml-py before 12.535 has only the older name.
    clock_reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if clock_reasons is None:
        clock_reasons = nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    reasons = ask(lambda: clock_reasons(handle))
    temperature = ask(lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
    return GpuSample(
        index=index,
        uuid=_str(nvml.nvmlDeviceGetUUID(handle)),
        name=_str(nvml.nvmlDeviceGetName(handle)),
        utilization_pct=float(utilization.gpu) if utilization is not None else None,
        memory_used_mb=int(memory.used) // _MIB,
        memory_total_mb=int(memory.total) // _MIB,
        temperature_c=float(temperature) if temperature is not None else None,
        power_w=power_mw / 1000 if power_mw is not None else None,
        power_limit_w=limit_mw / 1000 if limit_mw is not None else None,
        ecc_corrected=ecc(nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
        ecc_uncorrected=ecc(nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        retired_pages_single_bit=retired(
            nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        ),
        retired_pages_double_bit=retired(nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
        remapped_rows_correctable=int(remapped[0]) if remapped is not None else None,
        remapped_rows_uncorrectable=int(remapped[1]) if remapped is not None else None,
        remap_pending=bool(remapped[2]) if remapped is not None else None,
        remap_failed=bool(remapped[3]) if remapped is not None else None,
        throttle=(
            {name: bool(int(reasons) & bit) for bit, name in THROTTLE_BITS.items()}
            if reasons is not None
            else {}
        ),
    )


def _nvml_instances(nvml: Any, handle: Any, card: GpuSample) -> list[GpuSample]:
    current = _ask(nvml, lambda: nvml.nvmlDeviceGetMigMode(handle))
    if current is None or current[0] != nvml.NVML_DEVICE_MIG_ENABLE:
        return []
    instances = []
    for device in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, device)
        except nvml.NVMLError:
            continue  # an empty slot
        memory = nvml.nvmlDeviceGetMemoryInfo(mig)
        instances.append(
            GpuSample(
                index=mig_index(card.index, device),
                uuid=_str(nvml.nvmlDeviceGetUUID(mig)),
                name=_str(nvml.nvmlDeviceGetName(mig)),
                parent=card.index,
                memory_used_mb=int(memory.used) // _MIB,
                memory_total_mb=int(memory.total) // _MIB,
            )
        )
    return instances


def _pynvml() -> Any:
    try:
        import pynvml
    except ImportError as err:
        raise GpuToolMissing("pynvml (nvidia-ml-py) is not installed") from err
    return pynvml


class NvmlTelemetry:
    """Every card and MIG instance through NVML, read again on each call. `module` is pynvml or
    a fake of it.

    NVML stays initialised between readings: on a machine without persistence mode, each
    nvmlInit can wake the driver for every GPU, too slow to repeat every two seconds. After
    a failure it is shut down and initialised afresh at the next reading (a driver reload
    invalidates every handle). Reads raise GpuToolMissing where NVML cannot be loaded,
    GpuToolFailed when it fails.
    """

    def __init__(self, module: Any = None) -> None:
        self._module = module
        self._nvml: Any = None  # the module, once nvmlInit succeeded

    def read(self) -> list[GpuSample]:
        nvml = self._nvml
        if nvml is None:
            nvml = self._module if self._module is not None else _pynvml()
            try:
                nvml.nvmlInit()
            except nvml.NVMLError as err:
                raise GpuToolMissing(f"NVML unavailable: {err}") from err
            self._nvml = nvml
        try:
            samples: list[GpuSample] = []
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                card = _nvml_card(nvml, handle, index)
                samples.append(card)
                samples.extend(_nvml_instances(nvml, handle, card))
            return samples
        except nvml.NVMLError as err:
            self.close()
            raise GpuToolFailed(f"NVML failed: {err}") from err

    def close(self) -> None:
        nvml, self._nvml = self._nvml, None
        if nvml is not None:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()


def read_smi_telemetry(binary: str = "nvidia-smi", run: Runner = run_command) -> list[GpuSample]:
    result = run([binary, "-q", "-x"])
    if result.returncode == 127:
        raise GpuToolMissing(f"{binary} not found")
    if result.returncode != 0:
        reason = (result.stderr or result.stdout).strip()[-300:]
        raise GpuToolFailed(f"nvidia-smi -q -x exited {result.returncode}: {reason}")
    try:
        return parse_telemetry_xml(result.stdout)
    except (ValueError, SyntaxError) as err:
        raise GpuToolFailed(f"nvidia-smi -q -x gave unreadable XML: {err}") from err


@dataclass(frozen=True)
class TelemetryReading:
    samples: list[GpuSample]
    source: str  # "nvml", "nvidia-smi", or "none" on a machine without NVIDIA tooling
    problem: str = ""  # why the reading failed, when it did


def read_telemetry(
    nvml: Callable[[], list[GpuSample]],
    smi: Callable[[], list[GpuSample]] = read_smi_telemetry,
) -> TelemetryReading:
    """NVML first (a library call, milliseconds); nvidia-smi (a process, up to a second on
    eight cards) where NVML cannot be loaded or fails. Blocking: run it in a thread."""
    problems: list[str] = []
    for source, read in (("nvml", nvml), ("nvidia-smi", smi)):
        try:
            return TelemetryReading(read(), source)
        except GpuToolMissing:
            continue
        except GpuToolFailed as err:
            problems.append(str(err))
    return TelemetryReading([], "none", "; ".join(problems))
