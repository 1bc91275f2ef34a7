"""How far a ratio of two arms' figures could move by chance alone (pure).

On a 2-core machine an arm's mean over 144 requests moved by 10-20% between runs whose routing
decisions were the same (docs/benchmarks-history.md, KV routing, 2026-12-04, earlier):
queueing behind a slow request makes TTFT heavy-tailed. A goal such as "within 5% of the
oracle" is then decided by the run, not the router, unless the report says how wide the ratio's
uncertainty is. This gives a percentile bootstrap interval: each arm's requests resampled with
replacement, on its own, and the ratio of the resampled means taken, many times over. It
counts the spread among one run's requests; a slower or busier machine between arms adds to
that and is not in it.

`paired_ratio_interval` resamples whole workloads instead, each arm's figures on one workload
kept together with the oracle's on the same one. It covers what the first does not: which
groups happen to share a replica in a workload (the cached share's main spread), and a machine
that slows down between one workload's arms and the next. It needs a run of many workloads: with
a handful, the resamples repeat the same few and the interval comes out too narrow.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ROUNDS = 2000
# Fewer workloads than this give no paired interval: too few clusters to resample.
MIN_WORKLOADS = 6


def mean_ratio_interval(
    values: Sequence[float],
    base: Sequence[float],
    level: float = 0.95,
    rounds: int = ROUNDS,
    seed: int = 0,
) -> tuple[float, float]:
    """The `level` interval of mean(values) / mean(base); NaNs when either is empty. The same
    seed gives the same interval, so a report printed twice agrees with itself."""
    if not values or not base:
        return math.nan, math.nan
    rng = random.Random(seed)
    n, m = len(values), len(base)
    ratios = []
    for _ in range(rounds):
        top = sum(rng.choices(values, k=n)) / n
        bottom = sum(rng.choices(base, k=m)) / m
        if bottom > 0:
            ratios.append(top / bottom)
    return _percentiles(ratios, level)


def paired_ratio_interval(
    arm: Sequence[tuple[float, float]],
    base: Sequence[tuple[float, float]],
    level: float = 0.95,
    rounds: int = ROUNDS,
    seed: int = 0,
) -> tuple[float, float]:
    """The `level` interval of (sum of arm's tops / sum of its bottoms) over (the same of base),
    where entry i of each is one workload's (top, bottom): (TTFT summed, requests) for a mean,
    (cached tokens, prompt tokens) for a cached share. Workloads are resampled with
    replacement, the arm's and the base's of one workload together. NaNs with fewer than
    MIN_WORKLOADS workloads or lengths that differ."""
    if len(arm) != len(base) or len(arm) < MIN_WORKLOADS:
        return math.nan, math.nan
    rng = random.Random(seed)
    indices = range(len(arm))
    ratios = []
    for _ in range(rounds):
        picked = rng.choices(indices, k=len(arm))
        arm_bottom = sum(arm[i][1] for i in picked)
        base_top = sum(base[i][0] for i in picked)
        if arm_bottom > 0 and base_top > 0:
            arm_value = sum(arm[i][0] for i in picked) / arm_bottom
            base_value = base_top / sum(base[i][1] for i in picked)
            ratios.append(arm_value / base_value)
    return _percentiles(ratios, level)


@dataclass
class WorkloadSums:
    """One arm's sums over one workload (one repeat's seed)."""

    ttft_s: float = 0.0
    requests: int = 0
    cached_tokens: float = 0.0
    prompt_tokens: float = 0.0

    def add(self, ttft_s: float, cached_tokens: float, prompt_tokens: float) -> None:
        self.ttft_s += ttft_s
        self.requests += 1
        self.cached_tokens += cached_tokens
        self.prompt_tokens += prompt_tokens


Interval = tuple[float, float]


def workload_intervals(
    arm: Mapping[int, WorkloadSums], base: Mapping[int, WorkloadSums]
) -> tuple[Interval, Interval]:
    """The paired intervals of the arm's mean TTFT and of its cached share, each over the
    base's, on the workloads (by seed) both ran."""
    seeds = sorted(set(arm) & set(base))
    mine, theirs = [arm[s] for s in seeds], [base[s] for s in seeds]
    means = paired_ratio_interval(
        [(w.ttft_s, w.requests) for w in mine], [(w.ttft_s, w.requests) for w in theirs]
    )
    cached = paired_ratio_interval(
        [(w.cached_tokens, w.prompt_tokens) for w in mine],
        [(w.cached_tokens, w.prompt_tokens) for w in theirs],
    )
    return means, cached


def _percentiles(ratios: list[float], level: float) -> tuple[float, float]:
    if not ratios:
        return math.nan, math.nan
    ratios.sort()
    tail = (1 - level) / 2
    low = ratios[min(len(ratios) - 1, int(tail * len(ratios)))]
    high = ratios[min(len(ratios) - 1, int((1 - tail) * len(ratios)))]
    return low, high


def interval_text(low: float, high: float) -> str:
    """How a report prints an interval: "0.91-1.07", or "-" where there is none."""
    return "-" if math.isnan(low) else f"{low:.2f}-{high:.2f}"
