"""The fairness benchmark's figures and report: pure, no I/O, unit-tested.

A phase is one window of load through one gateway setting: the interactive keys alone ("no
flood"), or beside a batch flood. Each request is one `Sample`: how it was answered, when its
first token came, and when each streamed chunk arrived (llama-server streams one token a
chunk), so that a phase's throughput counts the tokens that arrived inside its window and not
those of requests that started before it or drained after it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from bench.gateway.stats import percentile

INTERACTIVE = "interactive"
FLOOD = "flood"
NO_FLOOD = "no flood"
# The goals from issue 30: with the fair queue on, the interactive keys' p99 TTFT under a flood
# at most this multiple of their p99 with no flood; the tokens served within this fraction of
# the gateway without the queue.
GOAL_P99_RATIO = 2.0
GOAL_THROUGHPUT_LOSS = 0.05


@dataclass
class Sample:
    """One request. `status`: the HTTP status, or 0 when no answer came (the connection failed,
    or the request was still open when the run gave up on it: lost). `tokens_at`: arrival
    times of the streamed chunks that carried text, on the run's clock."""

    kind: str  # INTERACTIVE or FLOOD
    key: str
    sent_at: float
    status: int = 0
    ttft_s: float | None = None
    retry_after: str | None = None
    completion_tokens: int = 0
    tokens_at: list[float] = field(default_factory=list)
    error: str = ""

    @property
    def refused(self) -> bool:
        return self.status in (429, 503)


@dataclass
class PhaseFigures:
    """What one phase measured. TTFTs in milliseconds; throughputs in tokens a second."""

    mode: str  # "off", "on", "on, 2 gateways"
    phase: str  # NO_FLOOD or "flood"
    window_s: float
    interactive_sent: int
    interactive_ok: int
    ttft_p50_ms: float
    ttft_p90_ms: float
    ttft_p99_ms: float
    ttft_max_ms: float
    tokens_per_s: float
    interactive_tokens_per_s: float
    flood_tokens_per_s: float
    statuses: dict[str, int]
    refusals_without_retry_after: int
    lost: int
    # A flood request's generation, first token to last (median): with every slot busy, one
    # frees every this / slots seconds on average, the earliest an interactive request can start.
    flood_generation_s: float = math.nan
    first_error: str = ""
    # The depth the gateway learnt for each replica at the phase's end (fair queue on).
    depths: dict[str, float] = field(default_factory=dict)


def summarise(
    mode: str,
    phase: str,
    samples: Sequence[Sample],
    window: tuple[float, float],
    depths: dict[str, float] | None = None,
) -> PhaseFigures:
    """The figures of one phase: TTFTs of the interactive requests sent in `window`, tokens
    that arrived in it, and how every request of the phase (drained ones included) ended."""
    start, end = window
    length = max(end - start, 1e-9)
    interactive = [s for s in samples if s.kind == INTERACTIVE and start <= s.sent_at < end]
    ttfts = [s.ttft_s for s in interactive if s.status == 200 and s.ttft_s is not None]
    in_window = {
        kind: sum(tokens_between(s.tokens_at, start, end) for s in samples if s.kind == kind)
        for kind in (INTERACTIVE, FLOOD)
    }
    errors = [s.error for s in samples if s.error]
    generations = [
        s.tokens_at[-1] - s.tokens_at[0]
        for s in samples
        if s.kind == FLOOD and s.status == 200 and len(s.tokens_at) > 1
    ]
    return PhaseFigures(
        mode=mode,
        phase=phase,
        window_s=length,
        interactive_sent=len(interactive),
        interactive_ok=len(ttfts),
        ttft_p50_ms=ms(percentile(ttfts, 50)),
        ttft_p90_ms=ms(percentile(ttfts, 90)),
        ttft_p99_ms=ms(percentile(ttfts, 99)),
        ttft_max_ms=ms(max(ttfts)) if ttfts else math.nan,
        tokens_per_s=(in_window[INTERACTIVE] + in_window[FLOOD]) / length,
        interactive_tokens_per_s=in_window[INTERACTIVE] / length,
        flood_tokens_per_s=in_window[FLOOD] / length,
        statuses=status_counts(samples),
        refusals_without_retry_after=sum(1 for s in samples if s.refused and not s.retry_after),
        lost=sum(1 for s in samples if s.status == 0),
        flood_generation_s=percentile(generations, 50),
        first_error=errors[0] if errors else "",
        depths=dict(depths or {}),
    )


def tokens_between(times: Iterable[float], start: float, end: float) -> int:
    return sum(1 for t in times if start <= t < end)


def status_counts(samples: Iterable[Sample]) -> dict[str, int]:
    """`{"200": 412, "429": 3, "lost": 0}`-like: statuses as strings, no answer as "lost"."""
    counted = Counter("lost" if s.status == 0 else str(s.status) for s in samples)
    return dict(sorted(counted.items()))


def ms(seconds: float) -> float:
    return seconds * 1000.0


def ratio(part: float, whole: float) -> float:
    if math.isnan(part) or math.isnan(whole) or whole <= 0:
        return math.nan
    return part / whole


def find(figures: Sequence[PhaseFigures], mode: str, phase: str) -> PhaseFigures | None:
    return next((f for f in figures if f.mode == mode and f.phase == phase), None)


@dataclass(frozen=True)
class Verdict:
    """The goals, each as its measured figure and whether it was met (None: not measured)."""

    p99_on: float  # on under the flood / on with no flood
    p99_off: float  # off under the flood / off with no flood
    throughput_on_off: float  # tokens a second, on / off, under the flood
    none_lost: bool
    retry_after_on_every_refusal: bool

    @property
    def p99_met(self) -> bool:
        return self.p99_on <= GOAL_P99_RATIO

    @property
    def throughput_met(self) -> bool:
        return self.throughput_on_off >= 1.0 - GOAL_THROUGHPUT_LOSS


def verdict(figures: Sequence[PhaseFigures]) -> Verdict | None:
    """The goals' figures, from the off and on phases (None when either is missing)."""
    off_quiet, off_flood = find(figures, "off", NO_FLOOD), find(figures, "off", FLOOD)
    on_quiet, on_flood = find(figures, "on", NO_FLOOD), find(figures, "on", FLOOD)
    if off_quiet is None or off_flood is None or on_quiet is None or on_flood is None:
        return None
    return Verdict(
        p99_on=ratio(on_flood.ttft_p99_ms, on_quiet.ttft_p99_ms),
        p99_off=ratio(off_flood.ttft_p99_ms, off_quiet.ttft_p99_ms),
        throughput_on_off=ratio(on_flood.tokens_per_s, off_flood.tokens_per_s),
        none_lost=all(f.lost == 0 for f in figures),
        retry_after_on_every_refusal=all(f.refusals_without_retry_after == 0 for f in figures),
    )


def format_statuses(statuses: dict[str, int]) -> str:
    return " ".join(f"{label}:{n}" for label, n in statuses.items()) or "-"


def table(figures: Sequence[PhaseFigures], markdown: bool = False) -> str:
    header = [
        "fair queue",
        "phase",
        "interactive n",
        "TTFT p50",
        "p90",
        "p99",
        "max",
        "tokens/s",
        "flood tok/s",
        "interactive tok/s",
        "statuses",
        "lost",
    ]
    rows = [
        [
            f.mode,
            f.phase,
            f"{f.interactive_ok}/{f.interactive_sent}",
            _ms(f.ttft_p50_ms),
            _ms(f.ttft_p90_ms),
            _ms(f.ttft_p99_ms),
            _ms(f.ttft_max_ms),
            f"{f.tokens_per_s:.0f}",
            f"{f.flood_tokens_per_s:.0f}",
            f"{f.interactive_tokens_per_s:.0f}",
            format_statuses(f.statuses),
            str(f.lost),
        ]
        for f in figures
    ]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i < 2 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in [header, *rows]
    )


def verdict_lines(found: Verdict | None) -> list[str]:
    if found is None:
        return ["goals: not measured (a phase is missing)"]

    def met(ok: bool) -> str:
        return "met" if ok else "NOT met"

    return [
        f"interactive p99 TTFT under the flood / with no flood: fair queue on {found.p99_on:.2f}x "
        f"(goal <= {GOAL_P99_RATIO:g}x: {met(found.p99_met)}), off {found.p99_off:.2f}x",
        f"tokens served under the flood, on / off: {found.throughput_on_off:.3f} "
        f"(goal >= {1 - GOAL_THROUGHPUT_LOSS:.2f}: {met(found.throughput_met)})",
        f"every request answered or refused: {met(found.none_lost)}; "
        f"Retry-After on every 429/503: {met(found.retry_after_on_every_refusal)}",
    ]


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.0f} ms"
