"""The fairness benchmark's figures: a phase counts the interactive requests sent in its window
and the tokens that arrived in it, and every request of the phase, drained ones included, in its
statuses; the goals are read from the off and on phases alike."""

from __future__ import annotations

import math

import pytest

from bench.fairness import FairnessConfig
from bench.fairness_gateway import FLOOD_KEY, key_limits
from bench.fairness_report import (
    FLOOD,
    INTERACTIVE,
    NO_FLOOD,
    PhaseFigures,
    Sample,
    summarise,
    table,
    verdict,
    verdict_lines,
)


def answered(kind: str, sent_at: float, ttft_s: float, tokens_at: list[float]) -> Sample:
    return Sample(kind, "k", sent_at, status=200, ttft_s=ttft_s, tokens_at=tokens_at)


def test_a_phase_counts_its_window_and_every_answer() -> None:
    samples = [
        # Sent before the window (the flood's settling): its tokens count only inside.
        answered(FLOOD, 0.0, 0.5, [0.5, 9.0, 10.5, 19.9, 20.0]),
        answered(INTERACTIVE, 10.0, 0.1, [10.1, 10.2]),
        answered(INTERACTIVE, 11.0, 0.3, [11.3]),
        # Sent after the window closed: neither its TTFT nor its tokens.
        answered(INTERACTIVE, 20.5, 9.0, [29.5]),
        Sample(INTERACTIVE, "k", 12.0, status=429, retry_after="2"),
        Sample(FLOOD, FLOOD_KEY, 12.0, status=503),  # no Retry-After
        Sample(FLOOD, FLOOD_KEY, 15.0, error="no answer"),  # lost
    ]
    found = summarise("on", FLOOD, samples, (10.0, 20.0), {"bench-0": 2.0})
    assert found.interactive_sent == 3
    assert found.interactive_ok == 2
    assert found.ttft_p50_ms == pytest.approx(200.0)
    assert found.ttft_max_ms == pytest.approx(300.0)
    assert found.flood_tokens_per_s == pytest.approx(0.2)  # 10.5 and 19.9
    assert found.interactive_tokens_per_s == pytest.approx(0.3)
    assert found.tokens_per_s == pytest.approx(0.5)
    assert found.statuses == {"200": 4, "429": 1, "503": 1, "lost": 1}
    assert found.refusals_without_retry_after == 1
    assert found.lost == 1
    assert found.first_error == "no answer"
    assert found.flood_generation_s == pytest.approx(19.5)
    assert found.depths == {"bench-0": 2.0}


def test_a_phase_without_answers_has_no_percentiles() -> None:
    found = summarise("off", NO_FLOOD, [], (0.0, 5.0))
    assert math.isnan(found.ttft_p99_ms)
    assert found.tokens_per_s == 0.0
    assert "-" in table([found])


def figures(mode: str, phase: str, p99_ms: float, tokens_per_s: float) -> PhaseFigures:
    return PhaseFigures(
        mode=mode,
        phase=phase,
        window_s=10.0,
        interactive_sent=10,
        interactive_ok=10,
        ttft_p50_ms=p99_ms / 2,
        ttft_p90_ms=p99_ms,
        ttft_p99_ms=p99_ms,
        ttft_max_ms=p99_ms,
        tokens_per_s=tokens_per_s,
        interactive_tokens_per_s=10.0,
        flood_tokens_per_s=tokens_per_s - 10.0,
        statuses={"200": 10},
        refusals_without_retry_after=0,
        lost=0,
    )


def test_the_goals_compare_each_setting_with_its_own_quiet_phase() -> None:
    phases = [
        figures("off", NO_FLOOD, 100.0, 50.0),
        figures("off", FLOOD, 9000.0, 400.0),
        figures("on", NO_FLOOD, 110.0, 50.0),
        figures("on", FLOOD, 330.0, 390.0),
    ]
    found = verdict(phases)
    assert found is not None
    assert found.p99_on == pytest.approx(3.0)
    assert found.p99_off == pytest.approx(90.0)
    assert found.throughput_on_off == pytest.approx(0.975)
    assert not found.p99_met
    assert found.throughput_met
    assert found.none_lost
    lines = verdict_lines(found)
    assert "3.00x" in lines[0]
    assert "NOT met" in lines[0]
    assert "0.975" in lines[1]
    assert verdict(phases[:3]) is None
    markdown = table(phases, markdown=True).splitlines()
    assert len(markdown) == 2 + len(phases)
    assert markdown[2].startswith("| off | no flood | 10/10 |")


def test_the_flood_key_may_ask_for_batch_only_and_floods_ten_times_the_slots() -> None:
    limits = key_limits()
    assert limits[FLOOD_KEY].top_priority == "batch"
    assert {lim.top_priority for name, lim in limits.items() if name != FLOOD_KEY} == {
        "interactive"
    }
    assert FairnessConfig(replicas=2, parallel=2).flood_streams == 40
