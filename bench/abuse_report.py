"""The hostile-client benchmark's figures and report: pure, no I/O, unit-tested.

A phase is one window of the good client's steady load, alone ("quiet") or beside one abuse
kind or all of them. Each phase's good-client latencies are compared with the quiet phase of
the same run: the machine's noise hits both alike, so the ratio is what the abuse cost.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from bench.gateway.stats import percentile

QUIET = "quiet"
ALL = "all"
QUIET_AFTER = "quiet after"
# The goal under abuse, from issue 11: the good client sees no errors, and its p99 stays
# within this multiple of its p99 in the quiet phase.
GOAL_P99_RATIO = 2.0


@dataclass
class GoodFigures:
    """The well-behaved client's requests in one phase; latencies of the successful ones."""

    sent: int = 0
    errors: int = 0
    latencies_s: list[float] = field(default_factory=list)
    error_kinds: dict[str, int] = field(default_factory=dict)

    def p_ms(self, q: float) -> float:
        return percentile(self.latencies_s, q) * 1000.0


@dataclass
class AbuseFigures:
    """What one abusive client sent and how the gateway answered: status codes, or how a
    connection ended ("reset", "cut after 12 s", ...)."""

    kind: str
    sent: int = 0
    answers: dict[str, int] = field(default_factory=dict)
    note: str = ""


@dataclass
class Phase:
    name: str
    good: GoodFigures
    abuse: list[AbuseFigures] = field(default_factory=list)
    # The gateway process's resident memory at the phase's start and its peak during it (MB).
    rss_start_mb: float | None = None
    rss_peak_mb: float | None = None


def count(labels: Iterable[str]) -> dict[str, int]:
    return dict(Counter(labels))


def merge_counts(*counts: Mapping[str, int]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for c in counts:
        total.update(c)
    return dict(total)


def format_counts(answers: Mapping[str, int]) -> str:
    """`401 x1,204, 429 x40`: most frequent first, then by label, so runs read alike."""
    if not answers:
        return "-"
    ordered = sorted(answers.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{label} x{n:,}" for label, n in ordered)


def p99_ratio(phase: Phase, quiet: Phase) -> float | None:
    here, base = phase.good.p_ms(99), quiet.good.p_ms(99)
    if math.isnan(here) or math.isnan(base) or base <= 0:
        return None
    return here / base


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.1f}"


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def good_rows(phases: Sequence[Phase]) -> list[list[str]]:
    quiet = next((p for p in phases if p.name == QUIET), None)
    rows = []
    for phase in phases:
        ratio = None if quiet is None or phase is quiet else p99_ratio(phase, quiet)
        rows.append(
            [
                phase.name,
                f"{phase.good.sent:,}",
                f"{phase.good.errors:,}",
                _ms(phase.good.p_ms(50)),
                _ms(phase.good.p_ms(99)),
                "-" if phase is quiet else _ratio(ratio),
                f"{_mb(phase.rss_start_mb)} -> {_mb(phase.rss_peak_mb)}",
            ]
        )
    return rows


GOOD_COLUMNS = (
    "phase",
    "good requests",
    "errors",
    "p50 ms",
    "p99 ms",
    "p99 / quiet",
    "gateway RSS MB start -> peak",
)
ABUSE_COLUMNS = ("abuse", "phase", "sent", "gateway answered")


def abuse_rows(phases: Sequence[Phase]) -> list[list[str]]:
    rows = []
    for phase in phases:
        for abuse in phase.abuse:
            answered = format_counts(abuse.answers)
            if abuse.note:
                answered += f" ({abuse.note})"
            rows.append([abuse.kind, phase.name, f"{abuse.sent:,}", answered])
    return rows


def text_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [len(c) for c in columns]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)))
    return "\n".join(lines)


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def goal_lines(phases: Sequence[Phase]) -> list[str]:
    """One line per phase under abuse: no errors, and p99 within GOAL_P99_RATIO of quiet."""
    quiet = next((p for p in phases if p.name == QUIET), None)
    if quiet is None:
        return ["no quiet phase: nothing to compare with"]
    lines = []
    for phase in phases:
        if phase is quiet:
            continue
        ratio = p99_ratio(phase, quiet)
        errors_ok = phase.good.errors == 0
        ratio_ok = ratio is not None and ratio <= GOAL_P99_RATIO
        verdict = "met" if errors_ok and ratio_ok else "MISSED"
        lines.append(
            f"{phase.name:<12} {verdict:<6} errors {phase.good.errors} (goal 0), "
            f"p99 {_ratio(ratio)} of quiet (goal <= {GOAL_P99_RATIO:g}x)"
        )
    return lines


def error_lines(phases: Sequence[Phase]) -> list[str]:
    lines = []
    for phase in phases:
        if phase.good.error_kinds:
            lines.append(
                f"good-client errors in {phase.name}: {format_counts(phase.good.error_kinds)}"
            )
    return lines


def report(phases: Sequence[Phase], markdown: bool = False) -> str:
    table = markdown_table if markdown else text_table
    parts = [
        table(GOOD_COLUMNS, good_rows(phases)),
        table(ABUSE_COLUMNS, abuse_rows(phases)),
        "\n".join(goal_lines(phases) + error_lines(phases)),
    ]
    return "\n\n".join(parts)
