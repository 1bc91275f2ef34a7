"""The routing benchmark's report: what one arm measured over its runs (`ArmResult`: times to
first token, the engines' cached and computed prompt tokens, the gateway's decisions, sums per
workload), and how it is shown: one run's split of prompt tokens across the engines
(`describe`) and the table of every arm's figures with their ratios and 95% intervals to the
oracle's (`table`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.intervals import WorkloadSums, interval_text, mean_ratio_interval, workload_intervals


@dataclass
class ArmResult:
    setting: str
    arm: str
    ttft_s: list[float] = field(default_factory=list)
    cached: float = 0.0
    computed: float = 0.0
    errors: int = 0
    # The gateway's decisions by reason (llmgw arm only), from its own /metrics.
    reasons: dict[str, float] = field(default_factory=dict)
    # workload's seed -> this arm's sums on it (the engines count cached tokens per run)
    by_workload: dict[int, WorkloadSums] = field(default_factory=dict)

    @property
    def mean_ms(self) -> float:
        return 1000 * statistics.fmean(self.ttft_s) if self.ttft_s else float("nan")

    @property
    def p90_ms(self) -> float:
        if len(self.ttft_s) < 2:
            return self.mean_ms
        return 1000 * statistics.quantiles(self.ttft_s, n=10, method="inclusive")[-1]

    @property
    def cached_share(self) -> float:
        total = self.cached + self.computed
        return self.cached / total if total else float("nan")


def describe(split: Sequence[tuple[float, float]]) -> str:
    """Each engine's share of the run's prompt tokens and its own cached share: where the load
    went (4 groups on 3 replicas: about 50/25/25 when two groups share one) and what it hit."""
    total = sum(cached + computed for cached, computed in split) or 1.0
    return "  ".join(
        f"{(cached + computed) / total:4.0%} ({cached / (cached + computed or 1.0):4.0%} cached)"
        for cached, computed in split
    )


def table(results: Sequence[ArmResult]) -> str:
    """Each arm's figures, and its ratios to the oracle's, or without one the first arm's."""
    named = "oracle" if any(r.arm == "oracle" for r in results) else results[0].arm
    lines = [
        f"{'setting':<14} {'arm':<14} {'n':>4} {'err':>3} {'mean TTFT':>10} {'p90 TTFT':>9} "
        f"{'cached':>7} {'mean/' + named:>11} {'95%: requests':>13} {'95%: workloads':>14} "
        f"{'p90/' + named:>10} {'cached/' + named:>13} {'95%: workloads':>14}"
    ]
    bases = {r.setting: r for r in reversed(results) if r.arm == named}
    for r in results:
        base = bases.get(r.setting)
        ratio = (r.mean_ms / base.mean_ms) if base else float("nan")
        ratio90 = (r.p90_ms / base.p90_ms) if base else float("nan")
        cached = (r.cached_share / base.cached_share) if base else float("nan")
        interval, mean_paired, cached_paired = "-", "-", "-"
        if base and base is not r:
            interval = interval_text(*mean_ratio_interval(r.ttft_s, base.ttft_s))
            means, shares = workload_intervals(r.by_workload, base.by_workload)
            mean_paired, cached_paired = interval_text(*means), interval_text(*shares)
        lines.append(
            f"{r.setting:<14} {r.arm:<14} {len(r.ttft_s):>4} {r.errors:>3} "
            f"{r.mean_ms:>8.0f}ms {r.p90_ms:>7.0f}ms {r.cached_share:>7.1%} "
            f"{ratio:>11.2f} {interval:>13} {mean_paired:>14} {ratio90:>10.2f} {cached:>13.2f} "
            f"{cached_paired:>14}"
        )
    for r in results:
        if r.reasons:
            counts = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r.reasons.items()))
            lines.append(f"gateway decisions ({r.setting}, {r.arm}): {counts}")
    return "\n".join(lines)
