"""Two gateways on one store in front of one engine of few slots (llama-server's gauges): a key
that floods through both cannot keep the engine to itself through the gateway where nobody else
is, because each gateway tells the other what its queue holds (gateway/queue_exchange.py).

Without the exchange, the gateway with only the flood refills every slot its own requests free
at once, before the other gateway's next scrape of the engine's gauges can show it free: the
interactive keys on the other gateway wait behind the flood's queue there. With it, that
gateway keeps to its share of the slots while the other has requests waiting."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from store import Store
from tests.gateway_kit import FakeRouteSource, fast_settings, route, running_gateway, serving
from tests.unit.test_gateway_fair_queue import SlotEngine, ask, new_key

SLOTS = 4
HOLD_S = 0.3
# Without the exchange a slot passes to the first gateway only when one of its scrapes falls
# between a flood request's end and the next one's arrival: at 50 ms a loaded machine (slower
# hops, the same scrape period) handed over so many that the comparison below came out even
# now and then; at 200 ms the flood keeps its slots, and the exchange's share is unaffected (it
# is heard through the store, not the gauges).
SCRAPE_S = 0.2


@contextlib.asynccontextmanager
async def engine_of(slots: int) -> AsyncIterator[SlotEngine]:
    engine = SlotEngine(HOLD_S, slots=asyncio.Semaphore(slots))
    app = web.Application()
    app.router.add_post("/v1/chat/completions", engine.chat)
    app.router.add_get("/metrics", engine.metrics)
    async with serving(app) as url:
        engine.url = url
        yield engine


FLOOD_HERE, FLOOD_THERE, CHATS = 4, 60, 6
# How many runs without the exchange may show that it matters (the test below says why).
CONTROL_RUNS = 3


async def flood_on_both_then_chat_on_one(store: Store, exchange: bool) -> tuple[list[str], int]:
    """The flood key sends 4 requests through the first gateway and 60 through the second (before
    either has read the engine's gauges: each sends it only its first depth until then); once
    the first's are done, three interactive keys send 6 each through the first. The order the
    engine started them in (until the last interactive request started: the flood's clients
    then leave), and how many had started when the interactive keys sent theirs."""
    flood = await new_key(store)
    chats = [await new_key(store) for _ in range(3)]
    tuned = fast_settings(
        engine_scrape_interval_s=SCRAPE_S, quota_sync_interval_s=0.1, queue_exchange=exchange
    )
    async with engine_of(SLOTS) as engine:
        source = FakeRouteSource(route("smol-0", engine.url))
        async with (
            running_gateway(store, source, tuned) as first,
            running_gateway(store, source, tuned) as second,
        ):
            here = [
                asyncio.create_task(ask(first, flood, f"flood-1 {i}")) for i in range(FLOOD_HERE)
            ]
            there = [
                asyncio.create_task(ask(second, flood, f"flood-2 {i}")) for i in range(FLOOD_THERE)
            ]
            assert [r.status_code for r in await asyncio.gather(*here)] == [200] * FLOOD_HERE
            await asyncio.sleep(0.3)  # a few exchange rounds: the first gateway has withdrawn
            sent_at = len(engine.started)
            asked = [
                asyncio.create_task(ask(first, chat, f"chat-{k} {i}"))
                for k, chat in enumerate(chats)
                for i in range(CHATS)
            ]
            statuses = [r.status_code for r in await asyncio.gather(*asked)]
            assert statuses == [200] * (3 * CHATS)
            started = list(engine.started)
            for task in there:
                task.cancel()
            await asyncio.gather(*there, return_exceptions=True)
            return started, sent_at


def floods_before_the_last_chat(started: list[str], sent_at: int) -> int:
    """Flood requests the engine started after the interactive keys sent theirs and before the
    last of those started."""
    last = max(i for i, name in enumerate(started) if name.startswith("chat"))
    return sum(name.startswith("flood") for name in started[sent_at:last])


async def test_a_flood_spread_over_two_gateways_does_not_hold_the_other_gateways_keys_back(
    store: Store,
) -> None:
    started, sent_at = await flood_on_both_then_chat_on_one(store, exchange=True)
    queued = FLOOD_HERE + FLOOD_THERE - sent_at
    assert queued >= 40, f"only {queued} flood requests were still queued: {started}"
    # Once the second gateway hears that the first has three keys waiting against the flood's
    # one, it keeps to its share, a quarter of the slots: the interactive keys' 18 requests
    # all start before a third of the flood that was queued when they were sent.
    with_exchange = floods_before_the_last_chat(started, sent_at)
    assert with_exchange < queued / 3, started
    # Without the exchange the second gateway refills each slot its own requests free before
    # the first can see it free; the first gets one now and then (a stale gauge, a request
    # between its end and the next one's arrival), so how many of the flood go first varies
    # from run to run: mostly 30 to 55, but once in a CI run 2 (against the exchange's 9). An
    # exchange that did nothing fails the bound above; this control shows that the setup tells
    # the two apart, and gets up to three runs to show more of the flood going first.
    without: list[int] = []
    for _ in range(CONTROL_RUNS):
        started, sent_at = await flood_on_both_then_chat_on_one(store, exchange=False)
        without.append(floods_before_the_last_chat(started, sent_at))
        if without[-1] > with_exchange:
            break
    assert max(without) > with_exchange, (with_exchange, without)
