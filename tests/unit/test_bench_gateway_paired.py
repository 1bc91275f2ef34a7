"""The gateway benchmark's paired rounds (bench/gateway/paired.py): the order the arms are
loaded in, and how the rounds become the CPU figure and its verdict. Offline."""

from __future__ import annotations

from bench.gateway import paired


def test_the_rounds_take_turns_at_going_first() -> None:
    assert [paired.order(n) for n in range(4)] == [
        ("hop", "llmgw"),
        ("llmgw", "hop"),
        ("hop", "llmgw"),
        ("llmgw", "hop"),
    ]


def test_the_figure_is_the_median_rounds_ratio_with_its_range() -> None:
    figures = paired.PairedFigures(
        "plain c64", hop_us=[100.0, 200.0, 100.0], llmgw_us=[120.0, 300.0, 125.0]
    )
    assert figures.ratios == [1.2, 1.5, 1.25]
    (line,) = paired.lines([figures])
    assert line.startswith("PASS  llmgw CPU per request <= 1.3x hop's (plain c64, median of 3")
    assert "1.25x (rounds 1.20x to 1.50x; llmgw 125 us, hop 100 us)" in line


def test_a_median_over_the_goal_misses_and_errors_are_reported() -> None:
    figures = paired.PairedFigures(
        "SSE c16", hop_us=[100.0, 100.0], llmgw_us=[140.0, 150.0], errors=2, first_error="reset"
    )
    verdict, errors = paired.lines([figures])
    assert verdict.startswith("MISS")
    assert "1.45x" in verdict
    assert errors == "paired SSE c16: 2 failed; first: reset"


def test_a_load_with_no_round_measured_says_so() -> None:
    (line,) = paired.lines([paired.PairedFigures("plain c64")])
    assert line.startswith("n/a")
    assert "no round measured" in line


def test_the_large_prompts_are_paired_against_their_own_goal() -> None:
    large_loads = [load for load in paired.LOADS if load.shape is not None]
    assert {load.shape for load in large_loads} == {"one string", "transcript"}
    assert all(load.goal == 1.5 and not load.stream for load in large_loads)
    figures = paired.PairedFigures(
        "200 KB one string c4 together", hop_us=[700.0], llmgw_us=[1_000.0], goal=1.5
    )
    (line,) = paired.lines([figures])
    assert line.startswith("PASS  llmgw CPU per request <= 1.5x hop's (200 KB one string c4")
    figures.llmgw_us = [1_100.0]
    assert paired.lines([figures])[0].startswith("MISS")
