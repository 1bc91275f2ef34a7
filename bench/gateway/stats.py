"""The figures of one arm, and the statistics that make them: pure, no I/O."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks (numpy's
    default); NaN for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ms(seconds: float) -> float:
    return seconds * 1000.0


def ratio(part: float | None, whole: float | None) -> float | None:
    if part is None or whole is None or whole <= 0 or math.isnan(part) or math.isnan(whole):
        return None
    return part / whole


@dataclass
class ArmFigures:
    """What one arm measured; None where it was not measured. Latencies in milliseconds."""

    name: str
    unavailable: str | None = None
    c1_p50_ms: float | None = None
    c1_p99_ms: float | None = None
    rps_c16: float | None = None
    rps_c64: float | None = None
    sse_c16: float | None = None
    ttfc_p50_ms: float | None = None
    # CPU time the proxy process spent per answer (c64) and per stream (SSE c16), in
    # microseconds: the figure least disturbed by other work on a shared machine.
    proxy_us_per_req: float | None = None
    proxy_us_per_stream: float | None = None
    # Share of one core used during the c64 run: the proxy process, and the load generator
    # plus the stand-in on the other core (about 1.0 there means the generator was the limit).
    proxy_cpu_c64: float | None = None
    load_cpu_c64: float | None = None
    errors: int = 0
    first_error: str | None = None

    def added(self, direct: ArmFigures | None) -> tuple[float | None, float | None]:
        """p50 and p99 at concurrency 1 less direct's: what this hop adds."""
        if direct is None or self.name == direct.name:
            return None, None
        return _minus(self.c1_p50_ms, direct.c1_p50_ms), _minus(self.c1_p99_ms, direct.c1_p99_ms)


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b
