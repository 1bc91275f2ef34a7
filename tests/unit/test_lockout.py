"""Locking out clients that keep failing to authenticate."""

from __future__ import annotations

import pytest

from gateway.lockout import FailedAuthLimiter, client_group, stored_group

T = 1_000_000.0


def fail(limiter: FailedAuthLimiter, client: str, times: int, now: float = T) -> float | None:
    locked = None
    for _ in range(times):
        locked = limiter.failed(client, now)
    return locked


def test_the_tenth_failure_in_a_minute_locks_the_client_for_a_minute() -> None:
    limiter = FailedAuthLimiter()
    assert fail(limiter, "203.0.113.7", 9) is None
    assert limiter.retry_after("203.0.113.7", T) is None
    assert limiter.failed("203.0.113.7", T + 5) == 60
    assert limiter.retry_after("203.0.113.7", T + 5) == pytest.approx(60)
    assert limiter.retry_after("203.0.113.7", T + 50) == pytest.approx(15)
    assert limiter.retry_after("203.0.113.7", T + 65) is None


def test_other_clients_are_unaffected() -> None:
    limiter = FailedAuthLimiter(max_failures=3)
    fail(limiter, "203.0.113.7", 3)
    assert limiter.retry_after("203.0.113.7", T) is not None
    assert limiter.retry_after("203.0.113.8", T) is None
    assert limiter.failed("203.0.113.8", T) is None


def test_failures_older_than_the_window_are_forgotten() -> None:
    limiter = FailedAuthLimiter(max_failures=3, window_s=60)
    fail(limiter, "c", 2, T)
    assert fail(limiter, "c", 2, T + 60) is None, "a new window began at T + 60"
    assert limiter.failed("c", T + 61) == 60


def test_after_a_lockout_the_client_starts_afresh() -> None:
    limiter = FailedAuthLimiter(max_failures=3, lockout_s=30)
    fail(limiter, "c", 3, T)
    assert limiter.failed("c", T + 31) is None
    assert limiter.retry_after("c", T + 31) is None


def test_successes_in_between_do_not_keep_a_guessing_client_unlocked() -> None:
    limiter = FailedAuthLimiter(max_failures=4)
    for i in range(3):
        limiter.failed("c", T + i)
        limiter.succeeded("c", T + i)
    assert limiter.failed("c", T + 3) == 60


def test_a_success_after_the_window_frees_the_entry() -> None:
    limiter = FailedAuthLimiter()
    limiter.failed("c", T)
    limiter.succeeded("c", T + 1)
    assert len(limiter) == 1
    limiter.succeeded("c", T + 61)
    assert len(limiter) == 0


def test_ipv6_clients_are_grouped_by_their_64() -> None:
    limiter = FailedAuthLimiter(max_failures=4)
    for host in ("::1", "::2", "::dead:beef", ":ffff:ffff:ffff:ffff"):
        limiter.failed(f"2001:db8:1:2{host}", T)
    assert limiter.retry_after("2001:0db8:0001:0002:0000:0000:0000:0abc", T) == 60
    assert limiter.retry_after("2001:db8:1:3::1", T) is None, "the next /64 is someone else"


def test_an_ipv4_mapped_address_is_the_ipv4_client() -> None:
    assert client_group("::ffff:203.0.113.7") == client_group("203.0.113.7")
    assert client_group("203.0.113.7") != client_group("203.0.113.8")


def test_addresses_that_do_not_parse_still_count_per_client() -> None:
    limiter = FailedAuthLimiter(max_failures=2)
    fail(limiter, "testclient", 2)
    assert limiter.retry_after("testclient", T) == 60
    assert limiter.retry_after("not:an:address", T) is None


def test_spraying_addresses_cannot_grow_the_table_past_its_bound() -> None:
    limiter = FailedAuthLimiter(max_clients=100)
    for i in range(10_000):
        limiter.failed(f"10.{i // 65_536}.{i // 256 % 256}.{i % 256}", T)
    assert len(limiter) == 100
    for i in range(10_000):
        limiter.failed(f"2001:db8:{i:x}::1", T)
    assert len(limiter) == 100


def test_a_locked_client_that_keeps_knocking_outlives_a_spray() -> None:
    limiter = FailedAuthLimiter(max_failures=2, max_clients=100)
    fail(limiter, "203.0.113.7", 2)
    for round_ in range(5):
        for i in range(99):
            limiter.failed(f"10.0.{round_}.{i}", T)
        assert limiter.retry_after("203.0.113.7", T) is not None
    # Idle for as long as it takes max_clients others to fail, it is forgotten: the trade-off
    # for a bounded table.
    for i in range(100):
        limiter.failed(f"10.1.0.{i}", T)
    assert limiter.retry_after("203.0.113.7", T) is None


def test_nonsense_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="lockout_s and max_clients must be positive"):
        FailedAuthLimiter(max_failures=0)
    with pytest.raises(ValueError, match="lockout_s and max_clients must be positive"):
        FailedAuthLimiter(max_clients=0)


def test_a_lockout_from_another_gateway_holds_here_for_its_whole_group() -> None:
    """What the store keeps (`stored_group`) locks out the same client group when another
    gateway applies it: an IPv6 client's whole /64, an IPv4 address alone."""
    limiter = FailedAuthLimiter()
    limiter.lock(stored_group("2001:db8:1:2::5"), 30, now=100.0)
    limiter.lock(stored_group("203.0.113.7"), 30, now=100.0)
    assert limiter.retry_after("2001:db8:1:2::ffff", 110.0) == 20.0
    assert limiter.retry_after("203.0.113.7", 110.0) == 20.0
    assert limiter.retry_after("2001:db8:1:3::5", 110.0) is None
    assert limiter.retry_after("203.0.113.8", 110.0) is None
    assert limiter.retry_after("203.0.113.7", 131.0) is None
