"""The gateway's side of shared limits (gateway/shared_limits.py) on a real store, without a
server: a busy key costs a few store round trips, not one per request; spend reaches the store
once; what a round cannot deliver stays owed."""

from __future__ import annotations

import asyncio
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest

from gateway.errors import ApiError
from gateway.lockout import FailedAuthLimiter
from gateway.quota import Denied, QuotaBook, Reservation
from gateway.shared_limits import HeldLimits, Need, SharedLimits
from gateway.store_health import StoreHealth
from store import KeyLimits, Store, open_store
from store.lease_rules import LeaseChange, LeaseState, PoolRef


class Counting:
    """A store that counts the lease round trips made through it and can be cut off."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.trips = 0
        self.cut = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def sync_leases(
        self, holder: str, ttl_s: float, changes: Sequence[LeaseChange]
    ) -> list[LeaseState]:
        if self.cut:
            raise ConnectionError("the store is unreachable")
        self.trips += 1
        return await self._store.sync_leases(holder, ttl_s, changes)


def shared(store: Counting, book: QuotaBook) -> SharedLimits:
    return SharedLimits(
        cast(Store, store), book, FailedAuthLimiter(), StoreHealth(30.0), 0.5, holder="gw-test"
    )


async def admit(limits: SharedLimits, book: QuotaBook, key_id: str, key: KeyLimits) -> Any:
    now = time.time()

    def attempt(held: HeldLimits) -> Any:
        return book.reserve(key_id, held, 10, now)

    return await limits.reserve(key_id, key, Need(10, 10), attempt, now)


async def test_a_busy_key_costs_a_few_round_trips_not_one_per_request(tmp_path: Path) -> None:
    real = open_store(None, tmp_path)
    await real.init()
    record, _ = await real.create_key("busy", limits=KeyLimits(rpm=100_000, token_budget=10**9))
    store, book = Counting(real), QuotaBook()
    limits = shared(store, book)
    verdicts = [await admit(limits, book, record.key_id, record.limits) for _ in range(300)]
    await real.close()
    assert all(isinstance(v, Reservation) for v in verdicts)
    assert store.trips <= 12, f"{store.trips} round trips for 300 requests"


async def test_spend_is_reported_once_even_across_a_failed_round(tmp_path: Path) -> None:
    real = open_store(None, tmp_path)
    await real.init()
    record, _ = await real.create_key("spender", limits=KeyLimits(token_budget=1_000))
    store, book = Counting(real), QuotaBook()
    limits = shared(store, book)
    for _ in range(3):
        reservation = await admit(limits, book, record.key_id, record.limits)
        book.settle(reservation, 7)
    store.cut = True
    with pytest.raises(ConnectionError):
        await limits.sync()
    assert not limits.health.reachable
    store.cut = False
    await limits.sync()
    await limits.sync()  # nothing left to report: counts nothing twice
    period = time.strftime("%Y-%m-%d", time.gmtime())
    (state,) = await real.sync_leases(
        "observer", 60, [LeaseChange(PoolRef(record.key_id, "budget", period))]
    )
    await real.close()
    assert state.spent == 21
    assert limits.health.reachable


async def test_fifty_requests_past_a_budget_cost_few_round_trips(tmp_path: Path) -> None:
    real = open_store(None, tmp_path)
    await real.init()
    record, _ = await real.create_key("five", limits=KeyLimits(token_budget=50))
    store, book = Counting(real), QuotaBook()
    limits = shared(store, book)
    verdicts = await asyncio.gather(
        *(admit(limits, book, record.key_id, record.limits) for _ in range(50))
    )
    await real.close()
    admitted = [v for v in verdicts if isinstance(v, Reservation)]
    refused = [v for v in verdicts if isinstance(v, Denied)]
    assert len(admitted) == 5
    assert {d.reason for d in refused} == {"budget"}
    assert "budget of 50 tokens" in refused[0].message
    # Slices shrink near the limit (a few trips), then one refusal answers all the rest.
    assert store.trips <= 8, f"{store.trips} round trips"


async def test_without_the_store_a_gateway_spends_what_it_holds_then_refuses(
    tmp_path: Path,
) -> None:
    real = open_store(None, tmp_path)
    await real.init()
    record, _ = await real.create_key("held", limits=KeyLimits(token_budget=10_000))
    store, book = Counting(real), QuotaBook()
    limits = shared(store, book)
    key_id = record.key_id
    before = [await admit(limits, book, key_id, record.limits) for _ in range(4)]
    pool = PoolRef(key_id, "budget", time.strftime("%Y-%m-%d", time.gmtime()))
    room = limits.held(pool) - book.in_use(key_id, "budget", time.time())
    store.cut = True
    with pytest.raises(ConnectionError):
        await limits.sync()
    trips = store.trips
    during = [await admit(limits, book, key_id, record.limits) for _ in range(room // 10)]
    with pytest.raises(ApiError) as refused:
        await admit(limits, book, key_id, record.limits)
    limits.check_store(time.time())  # within the grace: no refusal for that
    with pytest.raises(ApiError) as lost:
        limits.check_store(time.time() + limits.health.grace_s + 1)
    await real.close()
    assert all(isinstance(v, Reservation) for v in before + during)
    assert room >= 20, "the lease held more than the requests so far"
    assert store.trips == trips, "the held lease was spent without the store"
    assert refused.value.status == 503
    assert refused.value.code == "store_unreachable"
    assert lost.value.status == 503
    assert limits.health.refusals == 2


class Recording(Counting):
    """Also notes the pools each round trip named."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.pools: list[PoolRef] = []

    async def sync_leases(
        self, holder: str, ttl_s: float, changes: Sequence[LeaseChange]
    ) -> list[LeaseState]:
        self.pools += [change.pool for change in changes]
        return await super().sync_leases(holder, ttl_s, changes)


async def test_a_daily_budget_counts_against_the_new_days_pool_after_midnight(
    tmp_path: Path,
) -> None:
    # The key's pools are kept per key between requests: past midnight UTC, the same limits
    # must lease the new day's budget, not go on spending yesterday's.
    real = open_store(None, tmp_path)
    await real.init()
    record, _ = await real.create_key("daily", limits=KeyLimits(token_budget=10**6))
    store, book = Recording(real), QuotaBook()
    limits = shared(store, book)
    midnight = 1_796_601_600.0  # 2026-12-07T00:00:00Z

    async def at(now: float) -> Any:
        def attempt(held: HeldLimits) -> Any:
            return book.reserve(record.key_id, held, 10, now)

        return await limits.reserve(record.key_id, record.limits, Need(10, 10), attempt, now)

    assert isinstance(await at(midnight - 1), Reservation)
    assert isinstance(await at(midnight + 1), Reservation)
    await real.close()
    periods = [pool.period for pool in store.pools if pool.kind == "budget"]
    assert periods[0] == "2026-12-06"
    assert periods[-1] == "2026-12-07"


async def test_a_reloaded_keys_limits_keep_its_pools_the_same_objects(tmp_path: Path) -> None:
    # The holdings are keyed by the first pool objects they were given; equal but other objects
    # after the key cache reloads the limits would be compared field by field at every lookup.
    real = open_store(None, tmp_path)
    await real.init()
    try:
        book = QuotaBook()
        limits = shared(Counting(real), book)
        record, _ = await real.create_key("reloaded", limits=KeyLimits(rpm=100, tpm=10_000))
        assert isinstance(await admit(limits, book, record.key_id, record.limits), Reservation)
        now = time.time()
        before = limits._pools_of(record.key_id, record.limits, now)
        reloaded = KeyLimits(rpm=100, tpm=10_000)  # what the next reload reads: equal, not it
        after = limits._pools_of(record.key_id, reloaded, now)
        assert after == before
        assert all(after[kind] is before[kind] for kind in before)
        assert isinstance(await admit(limits, book, record.key_id, reloaded), Reservation)
        assert limits.held(before["rpm"]) > 0
    finally:
        await real.close()


def test_a_pool_sent_to_another_process_hashes_there_as_its_own_do() -> None:
    # str hashes differ between processes: a pool unpickled with this process's hash in it would
    # miss in that process's dicts.
    pool = PoolRef("k-1", "budget", "2026-12-01")
    script = (
        "import pickle, sys; from store.lease_rules import PoolRef; "
        "sys.stdout.buffer.write(pickle.dumps(PoolRef('k-1', 'budget', '2026-12-01')))"
    )
    other = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    arrived = pickle.loads(other.stdout)
    assert arrived == pool
    assert {pool: "held"}[arrived] == "held"
