"""The lease arithmetic shared limits rest on (store/lease_rules.py), without a store
or a server: what a pool grants, how spend and give-backs move through a lease, and that
several gateways leasing from one pool never admit past its limit."""

from __future__ import annotations

import random

from store.lease_rules import (
    LeaseChange,
    PoolRef,
    PoolRow,
    apply_change,
    grant_size,
    lease_ttl_s,
    shortfall,
    spare,
)

BUDGET = PoolRef("k1", "budget", "2026-12-03")


def test_a_pool_grants_the_need_and_what_is_wanted_or_nothing() -> None:
    assert grant_size(available=100, need=10, want=30, slack=0) == 30
    # What is wanted is cut to what is left, never below the need.
    assert grant_size(available=20, need=10, want=30, slack=0) == 20
    assert grant_size(available=9, need=10, want=30, slack=0) == 0


def test_slack_is_a_quarter_of_what_is_left_at_most() -> None:
    assert grant_size(available=1000, need=10, want=10, slack=50) == 60
    # Near the limit slices get small: 30 left past the need, a quarter of it.
    assert grant_size(available=40, need=10, want=10, slack=50) == 17
    assert grant_size(available=12, need=10, want=10, slack=50) == 10


def test_spend_comes_out_of_the_lease_and_overruns_still_count() -> None:
    pool = PoolRow(spent=0, leased=100)
    held, state = apply_change(pool, 100, 1000, LeaseChange(BUDGET, spent=30))
    assert (held, pool.spent, pool.leased) == (70, 30, 70)
    # An engine that ran past its max_tokens: 90 used against 70 held.
    held, state = apply_change(pool, held, 1000, LeaseChange(BUDGET, spent=90))
    assert (held, pool.spent, pool.leased) == (0, 120, 0)
    assert state.spent == 120


def test_give_back_returns_units_for_others() -> None:
    pool = PoolRow(spent=0, leased=80)
    held, _ = apply_change(pool, 80, 100, LeaseChange(BUDGET, give_back=50))
    assert (held, pool.leased) == (30, 30)
    # Nobody gives back more than it holds.
    held, _ = apply_change(pool, held, 100, LeaseChange(BUDGET, give_back=500))
    assert (held, pool.leased) == (0, 0)


def test_a_refused_need_says_so_and_changes_nothing() -> None:
    pool = PoolRow(spent=90, leased=5)
    held, state = apply_change(pool, 0, 100, LeaseChange(BUDGET, need=6, want=6))
    assert held == 0
    assert state.refused
    assert state.granted == 0
    assert (pool.spent, pool.leased) == (90, 5)


def test_a_revoked_key_gets_nothing_and_a_lifted_limit_everything_wanted() -> None:
    _, revoked = apply_change(PoolRow(), 0, 0, LeaseChange(BUDGET, need=1, want=1))
    assert revoked.refused
    held, lifted = apply_change(PoolRow(), 0, None, LeaseChange(BUDGET, need=5, want=500))
    assert held == 500
    assert not lifted.refused


def test_spare_keeps_what_is_in_use_and_the_expected_demand() -> None:
    assert spare(held=100, in_use=30, keep=20) == 50
    assert spare(held=10, in_use=30, keep=0) == 0
    assert shortfall(held=10, in_use=8, amount=5) == 3
    assert shortfall(held=10, in_use=2, amount=5) == 0


def test_a_lease_outlives_the_outage_grace_and_a_rate_window() -> None:
    assert lease_ttl_s(300.0, 0.5) > 300.0
    # A dead gateway's last minute of requests still counts against rpm.
    assert lease_ttl_s(0.0, 0.5) > 60.0
    assert lease_ttl_s(0.0, 5.0) >= 85.0


def test_many_gateways_leasing_from_one_pool_never_pass_the_limit() -> None:
    """Gateways with random demand lease, spend locally and give back, in random order; at every
    step spend plus leases stay within the limit, and every admitted token was leased."""
    rng = random.Random(7)
    limit = 5_000
    pool = PoolRow()
    held = [0, 0, 0]
    used = [0, 0, 0]  # spent locally, not yet reported
    admitted = 0
    for _ in range(2_000):
        gw = rng.randrange(3)
        request = rng.randint(1, 200)
        if held[gw] - used[gw] < request:
            need = shortfall(held[gw], used[gw], request)
            held[gw], _ = apply_change(
                pool, held[gw], limit, LeaseChange(BUDGET, need=need, want=need, slack=300)
            )
        if held[gw] - used[gw] >= request:
            used[gw] += request
            admitted += request
        if rng.random() < 0.2:  # a sync: report spend, give back half of what is spare
            back = spare(held[gw], used[gw], 0) // 2
            held[gw], _ = apply_change(
                pool, held[gw], limit, LeaseChange(BUDGET, spent=used[gw], give_back=back)
            )
            used[gw] = 0
        assert pool.spent + pool.leased <= limit
        assert pool.leased == sum(held)
    assert admitted == pool.spent + sum(used)
    assert admitted > limit * 0.9, "the budget was nearly all used: slices were given back"
