"""Several gateways on one store share one set of limits: leases granted atomically by SQLite
and PostgreSQL alike, budgets that hold whichever gateway a request lands on, lockouts that
reach every gateway, and a gateway that loses its store serving for a bounded time, then not."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from aiohttp import web

from gateway.prompt_estimate import estimate_prompt_tokens
from store import KeyLimits, Store, open_store
from store.lease_rules import LeaseChange, LeaseState, PoolRef
from tests.gateway_kit import (
    MODEL,
    FakeRouteSource,
    Gateway,
    assert_openai_error,
    fast_settings,
    route,
    running_gateway,
    serving,
)
from tests.unit.test_gateway_proxy import completion, metric, scripted
from tests.unit.test_store import BACKENDS, Backend, backend_named

MESSAGES = [{"role": "user", "content": "tell me about otters"}]


def today() -> str:
    """The UTC day the budget pools are named by, read when used: a run crossing midnight
    would otherwise look in yesterday's pool."""
    return time.strftime("%Y-%m-%d", time.gmtime())


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    async with backend_named(request.param, tmp_path) as backend:
        yield backend


async def pool_state(store: Store, pool: PoolRef) -> LeaseState:
    """The pool as the store has it, read by a holder that asks for nothing."""
    (state,) = await store.sync_leases("observer", 60, [LeaseChange(pool)])
    return state


# --- the store grants leases atomically ----------------------------------------------------


async def test_50_concurrent_leases_from_two_stores_never_pass_the_budget(
    backend: Backend,
) -> None:
    one, two = await backend.open(), await backend.open()
    record, _ = await one.create_key("shared", limits=KeyLimits(token_budget=50))
    pool = PoolRef(record.key_id, "budget", today())

    async def lease(store: Store, holder: str) -> int:
        (state,) = await store.sync_leases(holder, 60, [LeaseChange(pool, need=10, want=10)])
        return state.granted

    grants = await asyncio.gather(*(lease(one if i % 2 else two, f"gw-{i % 2}") for i in range(50)))
    assert sorted(g for g in grants if g) == [10] * 5
    state = await pool_state(one, pool)
    assert (state.spent, state.leased) == (0, 50)


async def test_spend_is_counted_once_and_an_expired_lease_is_reclaimed(backend: Backend) -> None:
    store = await backend.open()
    record, _ = await store.create_key("reclaimed", limits=KeyLimits(token_budget=100))
    pool = PoolRef(record.key_id, "budget", today())
    await store.sync_leases("dead", 60, [LeaseChange(pool, need=60, want=60)])
    (live,) = await store.sync_leases("live", 60, [LeaseChange(pool, need=60, want=60)])
    assert live.refused, "the dead gateway's lease still stands"
    await store.sync_leases("live", 60, [LeaseChange(pool, need=30, want=30)])
    # The live gateway reports 25 spent and gives back the rest; the dead one never renews.
    await store.sync_leases("live", 60, [LeaseChange(pool, spent=25, give_back=5)])
    await store.sync_leases("dead", -1, [])  # its leases expire now
    (after,) = await store.sync_leases("live", 60, [LeaseChange(pool, need=75, want=75)])
    assert after.granted == 75
    assert (after.spent, after.leased) == (25, 75)


async def test_a_revoked_key_is_granted_nothing(backend: Backend) -> None:
    store = await backend.open()
    record, _ = await store.create_key("revoked", limits=KeyLimits(rpm=100))
    await store.revoke_key(record.key_id)
    (state,) = await store.sync_leases(
        "gw", 60, [LeaseChange(PoolRef(record.key_id, "rpm"), need=1, want=1)]
    )
    assert state.refused
    assert state.held == 0


async def test_a_lockout_written_by_one_store_is_read_by_another(backend: Backend) -> None:
    one, two = await backend.open(), await backend.open()
    await one.lock_out("203.0.113.9", 30)
    await one.lock_out("203.0.113.9", 5)  # a shorter one does not cut it
    await one.lock_out("198.51.100.1", -1)  # already over
    active = await two.lockouts()
    assert set(active) == {"203.0.113.9"}
    assert 20 < active["203.0.113.9"] <= 30


# --- two gateways on one store ---------------------------------------------------------------


@dataclass
class HeldUpstream:
    """An upstream that answers nobody until released: every admitted request is in flight
    while the others are decided, so none is admitted on a settled request's leftovers."""

    url: str = ""
    calls: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)


@asynccontextmanager
async def held_upstream() -> AsyncIterator[HeldUpstream]:
    upstream = HeldUpstream()

    async def chat(request: web.Request) -> web.Response:
        upstream.calls += 1
        await request.read()
        await upstream.release.wait()
        return web.json_response(completion())

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    async with serving(app) as url:
        upstream.url = url
        yield upstream


async def test_two_gateways_admit_at_most_the_budget_between_them(backend: Backend) -> None:
    one, two = await backend.open(), await backend.open()
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 10}
    budget = 5 * (estimate_prompt_tokens(body) + 10)
    record, plaintext = await one.create_key(
        f"budget-{uuid.uuid4().hex[:6]}", limits=KeyLimits(token_budget=budget)
    )
    headers = {"Authorization": f"Bearer {plaintext}"}
    async with held_upstream() as upstream:
        source = FakeRouteSource(route("smol-0", upstream.url))
        async with running_gateway(one, source) as a, running_gateway(two, source) as b:
            sent = [
                asyncio.create_task(
                    (a if i % 2 else b).client.post(
                        "/v1/chat/completions", json=body, headers=headers
                    )
                )
                for i in range(50)
            ]
            deadline = time.monotonic() + 20
            while upstream.calls + sum(t.done() for t in sent) < 50:
                assert time.monotonic() < deadline, "requests neither refused nor sent upstream"
                await asyncio.sleep(0.02)
            upstream.release.set()
            responses = await asyncio.gather(*sent)
            admitted = [r for r in responses if r.status_code == 200]
            refused = [r for r in responses if r.status_code == 429]
            assert len(admitted) + len(refused) == 50
            for response in refused:
                assert_openai_error(response, 429, "quota_budget")
            # Each upstream answer reports 6 tokens; both gateways report their spend.
            state = await settled(one, PoolRef(record.key_id, "budget", today()), 6 * len(admitted))
    assert 1 <= len(admitted) <= 5
    assert upstream.calls == len(admitted)
    assert state.spent + state.leased <= budget
    rows = await one.usage(key_id=record.key_id)
    assert sum(r.prompt_tokens + r.completion_tokens for r in rows) == 6 * len(admitted)


async def settled(store: Store, pool: PoolRef, spent: int) -> LeaseState:
    deadline = time.monotonic() + 10
    while True:
        state = await pool_state(store, pool)
        if state.spent >= spent or time.monotonic() > deadline:
            assert state.spent == spent
            return state
        await asyncio.sleep(0.05)


async def test_requests_per_minute_hold_across_two_gateways(backend: Backend) -> None:
    one, two = await backend.open(), await backend.open()
    _, plaintext = await one.create_key("rpm-4", limits=KeyLimits(rpm=4))
    headers = {"Authorization": f"Bearer {plaintext}"}
    body = {"model": MODEL, "messages": MESSAGES}
    async with scripted() as upstream:
        source = FakeRouteSource(route("smol-0", upstream.url))
        async with running_gateway(one, source) as a, running_gateway(two, source) as b:
            statuses = [
                (
                    await (a if i % 2 else b).client.post(
                        "/v1/chat/completions", json=body, headers=headers
                    )
                ).status_code
                for i in range(10)
            ]
    assert statuses.count(200) == 4
    assert set(statuses) == {200, 429}


async def test_a_lockout_at_one_gateway_holds_at_the_other(backend: Backend) -> None:
    one, two = await backend.open(), await backend.open()
    settings = fast_settings(
        auth_failures_before_lockout=3, auth_lockout_s=30, quota_sync_interval_s=0.05
    )
    body = {"model": MODEL, "messages": MESSAGES}
    bad = {"Authorization": "Bearer llmgw-0badc0de-" + "a" * 43}
    async with scripted() as upstream:
        source = FakeRouteSource(route("smol-0", upstream.url))
        async with (
            running_gateway(one, source, settings) as a,
            running_gateway(two, source, settings) as b,
        ):
            for _ in range(3):
                await a.client.post("/v1/chat/completions", json=body, headers=bad)
            locked = await until_status(lambda: b.chat(), 429)
    assert_openai_error(locked, 429, "too_many_auth_failures")


async def until_status(
    send: Callable[[], Awaitable[httpx.Response]], status: int, timeout: float = 10
) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        response = await send()
        if response.status_code == status or time.monotonic() > deadline:
            return response
        await asyncio.sleep(0.05)


# --- losing the store -------------------------------------------------------------------------


class Severable:
    """A store whose connection a test can cut and restore: while cut, every call fails as a
    lost database connection would."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.cut = False

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._store, name)
        if not callable(attribute):
            return attribute

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.cut:
                raise ConnectionError("the store is unreachable")
            return await attribute(*args, **kwargs)

        return call


async def test_a_gateway_that_loses_its_store_serves_for_the_grace_then_refuses(
    tmp_path: Path,
) -> None:
    real = open_store(None, tmp_path)
    await real.init()
    severable = Severable(real)
    store = cast(Store, severable)
    settings = fast_settings(quota_sync_interval_s=0.05, store_outage_grace_s=2)
    try:
        async with scripted() as upstream:
            source = FakeRouteSource(route("smol-0", upstream.url))
            async with running_gateway(store, source, settings) as gw:
                assert (await gw.chat()).status_code == 200
                assert await metric(gw, "llmgw_store_reachable") == 1
                severable.cut = True
                await until_metric(gw, "llmgw_store_reachable", 0)
                during = await gw.chat()
                assert await metric(gw, "llmgw_store_unreachable_seconds") > 0
                after = await until_status(gw.chat, 503)
                assert await metric(gw, "llmgw_store_outage_refusals_total") >= 1
                severable.cut = False
                healed = await until_status(gw.chat, 200)
    finally:
        await real.close()
    assert during.status_code == 200, "a known key is served within the grace"
    assert_openai_error(after, 503, "store_unreachable")
    assert healed.status_code == 200


async def until_metric(gw: Gateway, name: str, value: float, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while await metric(gw, name) != value:
        assert time.monotonic() < deadline, f"{name} never reached {value}"
        await asyncio.sleep(0.05)
