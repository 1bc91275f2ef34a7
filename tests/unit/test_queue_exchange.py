"""The exchange between gateways' fair queues (gateway/queue_exchange.py), on a real store and
without a server: a gateway writes only when it has something to say, withdraws once, reads the
others' fresh reports into shares served from memory, and stops sharing when the store is gone."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from gateway.admission import AdmissionGate
from gateway.queue_exchange import QueueExchange
from store import Store
from store.queue_demand import Demand


class StubGate:
    """What the exchange reads of a gate: its demand, and a kick when shares change."""

    def __init__(self) -> None:
        self.wants: dict[str, dict[str, tuple[float, int, int]]] = {}
        self.kicks = 0

    def demand(self) -> Demand:
        return self.wants

    def kick(self) -> None:
        self.kicks += 1


class Counting:
    """A store that counts what the exchange writes, and can be cut off."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.writes: list[Demand] = []
        self.cut = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def publish_queue_demand(self, gateway: str, demand: Demand, keep_s: float) -> None:
        if self.cut:
            raise ConnectionError("the store is unreachable")
        self.writes.append(demand)
        await self._store.publish_queue_demand(gateway, demand, keep_s)

    async def queue_demands(self, within_s: float) -> Any:
        if self.cut:
            raise ConnectionError("the store is unreachable")
        return await self._store.queue_demands(within_s)


def pair(store: Store) -> tuple[QueueExchange, StubGate, Counting]:
    counting = Counting(store)
    return QueueExchange(cast(Store, counting), "gw-1", 0.1), StubGate(), counting


async def sync(exchange: QueueExchange, gate: StubGate) -> None:
    await exchange.sync(cast(AdmissionGate, gate))


async def test_an_idle_gateway_writes_nothing_and_withdraws_once(store: Store) -> None:
    exchange, gate, counting = pair(store)
    await sync(exchange, gate)
    assert counting.writes == []
    gate.wants = {"smol": {"k": (1.0, 3, 2)}}
    await sync(exchange, gate)
    await sync(exchange, gate)  # still something to say: written again, to stay fresh
    gate.wants = {}
    await sync(exchange, gate)
    await sync(exchange, gate)
    assert counting.writes == [{"smol": {"k": (1.0, 3, 2)}}] * 2 + [{}]
    assert await store.queue_demands(10) == []


async def test_shares_come_from_the_others_fresh_reports(store: Store) -> None:
    exchange, gate, _ = pair(store)
    gate.wants = {"smol": {"chat": (1.0, 1, 3)}}
    await sync(exchange, gate)
    assert exchange.share("smol") is None  # alone
    await store.publish_queue_demand("gw-2", {"smol": {"flood": (1.0, 40, 4)}}, 10)
    await sync(exchange, gate)
    assert exchange.share("smol") == pytest.approx(0.5)
    assert gate.kicks == 1  # the new share handed out whatever room it makes
    # The other gateway goes quiet: three rounds on, its report counts for nothing.
    await asyncio.sleep(0.35)
    await sync(exchange, gate)
    assert exchange.share("smol") is None


async def test_a_key_on_both_gateways_queues_here_with_its_part(store: Store) -> None:
    exchange, gate, _ = pair(store)
    gate.wants = {"smol": {"flood": (1.0, 5, 5)}}
    await store.publish_queue_demand("gw-2", {"smol": {"flood": (1.0, 20, 10)}}, 10)
    await sync(exchange, gate)
    assert exchange.key_part("smol", "flood") == pytest.approx(0.25)
    assert exchange.key_part("smol", "other") == 1.0


async def test_a_store_outage_stops_the_sharing_and_is_raised_to_the_loop(store: Store) -> None:
    exchange, gate, counting = pair(store)
    gate.wants = {"smol": {"chat": (1.0, 1, 3)}}
    await store.publish_queue_demand("gw-2", {"smol": {"flood": (1.0, 40, 4)}}, 10)
    await sync(exchange, gate)
    assert exchange.share("smol") is not None
    counting.cut = True
    # The loop (PeriodicTask) logs the first failure and the recovery, not every round.
    with pytest.raises(ConnectionError):
        await sync(exchange, gate)
    assert exchange.share("smol") is None
    counting.cut = False
    await sync(exchange, gate)
    assert exchange.share("smol") == pytest.approx(0.5)
