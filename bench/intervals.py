"""How far a ratio of two arms' mean TTFTs could move by chance alone (pure).

On a 2-core machine an arm's mean over 144 requests moved by 10-20% between runs whose routing
decisions were the same (docs/benchmarks.md): queueing behind a slow request makes TTFT
heavy-tailed. A goal such as "within 5% of the oracle" is then decided by the run, not the
router, unless the report says how wide the ratio's uncertainty is. This gives a percentile
bootstrap interval: each arm's requests resampled with replacement, on its own, and the ratio
of the resampled means taken, many times over. It counts the spread among one run's requests;
a slower or busier machine between arms adds to that and is not in it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

ROUNDS = 2000


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
