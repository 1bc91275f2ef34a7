"""The benchmarks' interval on a ratio of mean TTFTs (bench/intervals.py): it holds the ratio
the two samples' populations have, it narrows as the samples grow, and it tells apart a real
difference from run-to-run spread."""

from __future__ import annotations

import math
import random

from bench.intervals import mean_ratio_interval


def _skewed(rng: random.Random, count: int, scale: float) -> list[float]:
    # Heavy-tailed like TTFT under queueing: most requests quick, a few waiting behind others.
    return [scale * rng.expovariate(1.0) for _ in range(count)]


def test_two_samples_of_one_population_give_an_interval_around_one() -> None:
    rng = random.Random(1)
    low, high = mean_ratio_interval(_skewed(rng, 144, 0.3), _skewed(rng, 144, 0.3))
    assert low < 1.0 < high
    # 144 requests of a spread this wide cannot decide a 5% goal: the interval is wider.
    assert high - low > 0.2


def test_a_real_difference_lies_outside_the_interval_and_more_requests_narrow_it() -> None:
    rng = random.Random(2)
    small = mean_ratio_interval(_skewed(rng, 144, 0.6), _skewed(rng, 144, 0.3))
    large = mean_ratio_interval(_skewed(rng, 2304, 0.6), _skewed(rng, 2304, 0.3))
    assert small[0] > 1.0
    assert large[0] > 1.0
    assert large[0] < 2.0 < large[1]
    # Sixteen times the requests: about a quarter of the width.
    assert (large[1] - large[0]) < 0.4 * (small[1] - small[0])


def test_the_same_samples_give_the_same_interval_and_empty_ones_none() -> None:
    values, base = [0.2, 0.3, 0.9, 0.25], [0.2, 0.35, 0.3, 0.4]
    assert mean_ratio_interval(values, base) == mean_ratio_interval(values, base)
    assert all(math.isnan(x) for x in mean_ratio_interval([], base))
    assert all(math.isnan(x) for x in mean_ratio_interval(values, []))
