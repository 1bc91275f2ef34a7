"""The per-replica circuit breaker, driven by a hand-held clock."""

from __future__ import annotations

import pytest

from gateway.routing.breaker import BreakerState, CircuitBreaker


def trip(breaker: CircuitBreaker, replica: str, now: float) -> None:
    for _ in range(breaker.failures_to_open):
        breaker.failed(replica, now)


def test_three_consecutive_failures_eject_and_a_success_in_between_resets() -> None:
    breaker = CircuitBreaker()
    breaker.failed("r", 0.0)
    breaker.failed("r", 0.1)
    breaker.succeeded("r", 0.2)
    breaker.failed("r", 0.3)
    breaker.failed("r", 0.4)
    assert breaker.allows("r", 0.5)
    assert breaker.state("r", 0.5) is BreakerState.CLOSED
    breaker.failed("r", 0.5)
    assert breaker.state("r", 0.6) is BreakerState.OPEN
    assert not breaker.allows("r", 0.6)
    assert breaker.allows("other", 0.6)


def test_half_open_lets_exactly_one_probe_through_and_its_success_closes() -> None:
    breaker = CircuitBreaker(open_s=5.0)
    trip(breaker, "r", 10.0)
    assert not breaker.allows("r", 14.9)
    assert breaker.state("r", 15.0) is BreakerState.HALF_OPEN
    # Asking is free: the router asks about every candidate and picks one.
    assert breaker.allows("r", 15.0)
    assert breaker.allows("r", 15.0)
    breaker.started("r", 15.0)
    assert not breaker.allows("r", 15.1), "the probe is out: nobody else goes"
    breaker.succeeded("r", 16.0)
    assert breaker.state("r", 16.0) is BreakerState.CLOSED
    assert breaker.allows("r", 16.0)


def test_failed_probes_double_the_open_period_up_to_the_cap() -> None:
    breaker = CircuitBreaker(open_s=5.0, max_open_s=60.0)
    now = 0.0
    trip(breaker, "r", now)
    periods = []
    for _ in range(6):
        opened = now
        while not breaker.allows("r", now):
            now += 0.5
        periods.append(now - opened)
        breaker.started("r", now)
        breaker.failed("r", now)
    assert periods == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0]
    # A success resets the backoff: the next ejection is short again.
    while not breaker.allows("r", now):
        now += 0.5
    breaker.succeeded("r", now)
    trip(breaker, "r", now)
    assert breaker.allows("r", now + 5.0)


def test_late_failures_while_open_do_not_stretch_the_ejection() -> None:
    breaker = CircuitBreaker(open_s=5.0)
    trip(breaker, "r", 0.0)
    breaker.failed("r", 4.0)  # a request sent before the ejection, failing late
    assert breaker.allows("r", 5.0)


def test_a_probe_that_never_reports_stops_blocking_after_its_timeout() -> None:
    breaker = CircuitBreaker(open_s=5.0, probe_timeout_s=30.0)
    trip(breaker, "r", 0.0)
    breaker.started("r", 5.0)
    assert not breaker.allows("r", 34.0)
    assert breaker.allows("r", 35.0)


def test_the_replica_ejected_longest_ago_is_named() -> None:
    breaker = CircuitBreaker()
    trip(breaker, "late", 3.0)
    trip(breaker, "early", 1.0)
    assert breaker.ejected_longest_ago(["late", "early", "healthy"]) == "early"
    assert breaker.ejected_longest_ago(["healthy"]) is None
    breaker.forget("early")
    assert breaker.known() == {"late"}


def test_nonsense_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="need failures_to_open >= 1"):
        CircuitBreaker(failures_to_open=0)
    with pytest.raises(ValueError, match="need failures_to_open >= 1"):
        CircuitBreaker(open_s=10.0, max_open_s=5.0)
