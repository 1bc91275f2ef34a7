"""The benchmarks' intervals on a ratio of two arms' figures (bench/intervals.py): they hold the
ratio the two samples' populations have, narrow as the samples grow, and tell apart a real
difference from run-to-run spread; paired by workload, a workload's luck shared by both arms
stays out."""

from __future__ import annotations

import math
import random

from bench.intervals import (
    MIN_WORKLOADS,
    WorkloadSums,
    mean_ratio_interval,
    paired_ratio_interval,
    workload_intervals,
)


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


Sums = list[tuple[float, float]]


def _workloads(rng: random.Random, count: int, arm_share: float) -> tuple[Sums, Sums]:
    """`count` workloads whose cached share swings widely with the draw (which groups share a
    replica), the arm's each `arm_share` of the oracle's on the same workload, give or take 2%."""
    arm, base = [], []
    for _ in range(count):
        luck = rng.uniform(0.3, 0.6)
        base.append((1000 * luck, 1000.0))
        arm.append((1000 * luck * arm_share * rng.uniform(0.98, 1.02), 1000.0))
    return arm, base


def test_pairing_by_workload_keeps_the_workloads_luck_out_of_the_interval() -> None:
    rng = random.Random(3)
    arm, base = _workloads(rng, 20, 1.0)
    low, high = paired_ratio_interval(arm, base)
    assert low < 1.0 < high
    assert high - low < 0.03
    # The same shares unpaired (each arm's workloads resampled on their own) carry the luck.
    unpaired = mean_ratio_interval([top for top, _ in arm], [top for top, _ in base])
    assert unpaired[1] - unpaired[0] > 3 * (high - low)
    # An arm 5% short on every workload is told apart from the oracle.
    short, base = _workloads(rng, 20, 0.95)
    low, high = paired_ratio_interval(short, base)
    assert low < 0.95 < high < 0.98


def test_too_few_workloads_or_unmatched_ones_give_no_paired_interval() -> None:
    rng = random.Random(4)
    arm, base = _workloads(rng, MIN_WORKLOADS - 1, 1.0)
    assert all(math.isnan(x) for x in paired_ratio_interval(arm, base))
    arm, base = _workloads(rng, MIN_WORKLOADS, 1.0)
    assert not any(math.isnan(x) for x in paired_ratio_interval(arm, base))
    assert all(math.isnan(x) for x in paired_ratio_interval(arm, base[:-1]))


def test_workload_sums_pair_the_arms_on_the_seeds_both_ran() -> None:
    arm = {seed: WorkloadSums() for seed in range(8)}
    base = {seed: WorkloadSums() for seed in range(1, 9)}
    for seed in range(9):
        if seed in arm:  # twice as slow, cached half as much, on every workload
            arm[seed].add(0.4, 50, 300)
            arm[seed].add(0.6, 50, 300)
        if seed in base:
            base[seed].add(0.2, 100, 300)
            base[seed].add(0.3, 100, 300)
    (mean_low, mean_high), (cached_low, cached_high) = workload_intervals(arm, base)
    # Seeds 1-7 only: constant ratios give a point.
    assert math.isclose(mean_low, 2.0)
    assert math.isclose(mean_high, 2.0)
    assert math.isclose(cached_low, 0.5)
    assert math.isclose(cached_high, 0.5)
