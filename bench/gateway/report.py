"""The table, the ratios and the goals, as plain text for the terminal and as Markdown for
docs/benchmarks.md: pure functions of the figures."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.gateway.stats import ArmFigures, ratio

COLUMNS = (
    "arm",
    "c1 p50 ms",
    "c1 p99 ms",
    "added p50 ms",
    "added p99 ms",
    "req/s c16",
    "req/s c64",
    "SSE/s c16",
    "TTFC p50 ms",
    "proxy CPU us/req",
    "us/stream",
    "CPU proxy/load c64",
)

# The gateway's goals on this benchmark.
GOAL_SHARE_OF_HOP = 0.50
GOAL_ADDED_P50_MS = 0.3
GOAL_ADDED_P99_MS = 1.0
# Issue 35: llmgw's added p50 at most the bare hop's plus this.
GOAL_ADDED_OVER_HOP_MS = 0.1
GOAL_SSE_SHARE_OF_DIRECT = 0.80


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _added(value: float | None) -> str:
    return "-" if value is None else f"{value:+.3f}"


def _cpu(arm: ArmFigures) -> str:
    if arm.load_cpu_c64 is None:
        return "-"
    proxy = "-" if arm.proxy_cpu_c64 is None else f"{arm.proxy_cpu_c64:.0%}"
    return f"{proxy} / {arm.load_cpu_c64:.0%}"


def rows(arms: Sequence[ArmFigures]) -> list[list[str]]:
    direct = next((a for a in arms if a.name == "direct" and a.unavailable is None), None)
    out = []
    for arm in arms:
        if arm.unavailable is not None:
            out.append([arm.name, f"unavailable: {arm.unavailable.splitlines()[0]}"])
            continue
        added_p50, added_p99 = arm.added(direct)
        out.append(
            [
                arm.name,
                _ms(arm.c1_p50_ms),
                _ms(arm.c1_p99_ms),
                _added(added_p50),
                _added(added_p99),
                _num(arm.rps_c16),
                _num(arm.rps_c64),
                _num(arm.sse_c16),
                _ms(arm.ttfc_p50_ms),
                _num(arm.proxy_us_per_req),
                _num(arm.proxy_us_per_stream),
                _cpu(arm),
            ]
        )
    return out


def text_table(arms: Sequence[ArmFigures]) -> str:
    body = rows(arms)
    full = [r for r in body if len(r) == len(COLUMNS)]
    # max() of a list: with every arm unavailable there are no full rows, only the headings.
    widths = [max([len(c), *(len(r[i]) for r in full)]) for i, c in enumerate(COLUMNS)]

    def line(cells: Sequence[str]) -> str:
        if len(cells) != len(COLUMNS):
            return f"{cells[0]:<{widths[0]}}  {cells[1]}"
        first = f"{cells[0]:<{widths[0]}}"
        return "  ".join(
            [first, *(f"{c:>{w}}" for c, w in zip(cells[1:], widths[1:], strict=True))]
        )

    return "\n".join([line(COLUMNS), *(line(r) for r in body)])


def markdown_table(arms: Sequence[ArmFigures]) -> str:
    lines = [
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join([":---", *("---:" for _ in COLUMNS[1:])]) + "|",
    ]
    for r in rows(arms):
        cells = r if len(r) == len(COLUMNS) else [r[0], r[1], *("" for _ in COLUMNS[2:])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@dataclass(frozen=True)
class Verdict:
    goal: str
    measured: str
    passed: bool | None  # None: not measured

    @property
    def mark(self) -> str:
        return {True: "PASS", False: "MISS", None: "n/a "}[self.passed]


def _by_name(arms: Sequence[ArmFigures]) -> Callable[[str], ArmFigures | None]:
    table = {a.name: a for a in arms if a.unavailable is None}
    return table.get


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def _times(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}x"


def ratio_lines(arms: Sequence[ArmFigures]) -> list[str]:
    arm = _by_name(arms)
    llmgw, hop, litellm, direct = arm("llmgw"), arm("hop"), arm("litellm"), arm("direct")
    router = arm("vllm-router")
    if llmgw is None:
        return []

    def of(other: ArmFigures | None, field: str) -> float | None:
        if other is None:
            return None
        return ratio(getattr(llmgw, field), getattr(other, field))

    return [
        f"llmgw req/s as % of hop:      c16 {_pct(of(hop, 'rps_c16'))}, "
        f"c64 {_pct(of(hop, 'rps_c64'))}",
        f"llmgw req/s as x LiteLLM:     c16 {_times(of(litellm, 'rps_c16'))}, "
        f"c64 {_times(of(litellm, 'rps_c64'))}; "
        f"SSE {_times(of(litellm, 'sse_c16'))}",
        f"llmgw SSE/s as % of direct:   {_pct(of(direct, 'sse_c16'))} "
        f"(hop: {_pct(ratio(hop.sse_c16, direct.sse_c16) if hop and direct else None)})",
        f"proxy CPU per request (c64):  llmgw {_num(llmgw.proxy_us_per_req)} us, "
        f"{_times(of(hop, 'proxy_us_per_req'))} hop's; "
        f"per stream {_num(llmgw.proxy_us_per_stream)} us, "
        f"{_times(of(hop, 'proxy_us_per_stream'))} hop's",
        # The fastest peer: how far llmgw is from it, in throughput and in CPU per request.
        f"llmgw as % of vLLM router:    req/s c16 {_pct(of(router, 'rps_c16'))}, "
        f"c64 {_pct(of(router, 'rps_c64'))}; SSE/s {_pct(of(router, 'sse_c16'))}",
        f"proxy CPU as x vLLM router's: per request {_times(of(router, 'proxy_us_per_req'))} "
        f"(router {_num(router.proxy_us_per_req if router else None)} us), per stream "
        f"{_times(of(router, 'proxy_us_per_stream'))} "
        f"(router {_num(router.proxy_us_per_stream if router else None)} us)",
        *_tracing_lines(arm("llmgw-otel"), llmgw),
    ]


def _tracing_lines(traced: ArmFigures | None, llmgw: ArmFigures) -> list[str]:
    """What tracing every request costs: the traced arm against llmgw's own, in one run."""
    if traced is None:
        return []

    def times(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f}x"

    return [
        f"tracing on (llmgw-otel):      proxy CPU per request "
        f"{times(ratio(traced.proxy_us_per_req, llmgw.proxy_us_per_req))} llmgw's, "
        f"per stream {times(ratio(traced.proxy_us_per_stream, llmgw.proxy_us_per_stream))}; "
        f"req/s c64 {_pct(ratio(traced.rps_c64, llmgw.rps_c64))} of llmgw's"
    ]


def verdicts(arms: Sequence[ArmFigures]) -> list[Verdict]:
    arm = _by_name(arms)
    llmgw, hop, direct = arm("llmgw"), arm("hop"), arm("direct")
    if llmgw is None:
        return []
    out = []
    shares = [
        ratio(llmgw.rps_c16, hop.rps_c16) if hop else None,
        ratio(llmgw.rps_c64, hop.rps_c64) if hop else None,
    ]
    worst = None if None in shares else min(s for s in shares if s is not None)
    out.append(
        Verdict(
            f"llmgw req/s >= {GOAL_SHARE_OF_HOP:.0%} of hop's (c16 and c64)",
            _pct(worst),
            None if worst is None else worst >= GOAL_SHARE_OF_HOP,
        )
    )
    added_p50, added_p99 = llmgw.added(direct)
    out.append(
        Verdict(
            f"added p50 <= {GOAL_ADDED_P50_MS} ms at concurrency 1",
            "n/a" if added_p50 is None else f"{added_p50:.3f} ms",
            None if added_p50 is None else added_p50 <= GOAL_ADDED_P50_MS,
        )
    )
    hop_p50 = hop.added(direct)[0] if hop else None
    over_hop = None if added_p50 is None or hop_p50 is None else added_p50 - hop_p50
    out.append(
        Verdict(
            f"added p50 <= the hop's + {GOAL_ADDED_OVER_HOP_MS} ms at concurrency 1",
            "n/a"
            if over_hop is None
            else f"the hop's {'+' if over_hop >= 0 else '-'} {abs(over_hop):.3f} ms",
            None if over_hop is None else over_hop <= GOAL_ADDED_OVER_HOP_MS,
        )
    )
    out.append(
        Verdict(
            f"added p99 <= {GOAL_ADDED_P99_MS} ms at concurrency 1",
            "n/a" if added_p99 is None else f"{added_p99:.3f} ms",
            None if added_p99 is None else added_p99 <= GOAL_ADDED_P99_MS,
        )
    )
    sse = ratio(llmgw.sse_c16, direct.sse_c16) if direct else None
    out.append(
        Verdict(
            f"llmgw SSE/s >= {GOAL_SSE_SHARE_OF_DIRECT:.0%} of direct's",
            _pct(sse),
            None if sse is None else sse >= GOAL_SSE_SHARE_OF_DIRECT,
        )
    )
    return out


def goal_lines(arms: Sequence[ArmFigures]) -> list[str]:
    return [f"{v.mark}  {v.goal}: {v.measured}" for v in verdicts(arms)]


def error_lines(arms: Sequence[ArmFigures]) -> list[str]:
    return [
        f"{a.name}: {a.errors} failed requests in the measured windows; first: {a.first_error}"
        for a in arms
        if a.unavailable is None and (a.errors or a.first_error)
    ]


def markdown(arms: Sequence[ArmFigures], setup: str) -> str:
    parts = [markdown_table(arms), "", setup, ""]
    parts += [f"- {line}" for line in ratio_lines(arms)]
    parts += [f"- {line}" for line in goal_lines(arms)]
    return "\n".join(parts).rstrip() + "\n"
