"""Who waits for what in the fair queue, as the console's JSON (GET /admin/v1/console), the
gateway's /metrics and `llmgw top`'s live source say it: per model, key and class the requests
waiting and the oldest's wait, refusals by reason, each replica's learnt depth. Against an
engine of two slots that reports its running and waiting requests as llama-server does
(tests/unit/test_gateway_fair_queue.py)."""

from __future__ import annotations

import asyncio
import uuid

from prometheus_client.parser import text_string_to_metric_families

from gateway.admission.metrics import AdmissionCollector
from store import KeyLimits, Store
from store.fleet import FleetTables
from tests.gateway_kit import MODEL, FakeRouteSource, route, running_gateway
from tests.unit.test_admission_gate import BATCH, INTERACTIVE, gate
from tests.unit.test_gateway_fair_queue import (
    SLOTS,
    ask,
    queue_of,
    settings,
    slot_engine,
    until,
)
from workers.top.source import LiveSource


async def named_key(store: Store, prefix: str) -> tuple[str, dict[str, str]]:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    _, plaintext = await store.create_key(name, limits=KeyLimits())
    return name, {"Authorization": f"Bearer {plaintext}"}


async def test_the_console_and_top_show_who_waits_for_what_refusals_and_depths(
    store: Store, fleet: FleetTables
) -> None:
    busy, keep_busy = await named_key(store, "busy")
    flooder, flood = await named_key(store, "flood")
    chatter, chat = await named_key(store, "chat")
    async with slot_engine() as engine:
        # Held until the test has read the console: on a loaded machine a fixed hold could end
        # first, and the queue drain before it is looked at.
        engine.gate = asyncio.Event()
        source = FakeRouteSource(route("smol-0", engine.url))
        async with running_gateway(store, source, settings(queue_per_key=2)) as gw:
            idle = await queue_of(gw)
            assert idle["enabled"] is True
            assert idle["waiting"] == []
            await asyncio.sleep(0.2)  # the engine's gauges read once while idle
            # Two run; the rest wait in the engine or, once its depth is learnt, here.
            tasks = [asyncio.create_task(ask(gw, keep_busy, f"busy {i}")) for i in range(SLOTS + 2)]
            await until(lambda: len(engine.started) >= SLOTS)
            await asyncio.sleep(0.1)
            # These wait in the gateway; the flooder's third batch request is past its bound.
            tasks += [
                asyncio.create_task(ask(gw, flood, f"wait {i}", priority="batch")) for i in range(2)
            ]
            tasks.append(asyncio.create_task(ask(gw, chat, "chat", priority="interactive")))
            await asyncio.sleep(0.2)
            refused = await ask(gw, flood, "one too many", priority="batch")
            assert refused.status_code == 429
            queue = await queue_of(gw)
            metrics = (await gw.client.get("/metrics")).text
            top = await LiveSource(None, fleet, gw.url).read()  # type: ignore[arg-type]
            engine.gate.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    waiting = [(w["model"], w["key"], w["priority"], w["waiting"]) for w in queue["waiting"]]
    # Highest class first (the busy key's standard requests, if any wait, between the two).
    assert [w for w in waiting if w[1] != busy] == [
        (MODEL, chatter, "interactive", 1),
        (MODEL, flooder, "batch", 2),
    ]
    for row in queue["waiting"]:
        assert 0.1 <= row["oldest_s"] < 5
    busy_waiting = sum(w[3] for w in waiting if w[1] == busy)
    assert queue["admitted"] == [{"model": MODEL, "requests": SLOTS + 2 - busy_waiting}]
    assert queue["refusals"] == [{"model": MODEL, "reason": "queue_full", "count": 1.0}]
    # The engine was seen with requests waiting: its depth is its running count, its slots.
    assert queue["depths"] == [{"replica": "smol-0", "model": MODEL, "depth": SLOTS}]

    samples = {
        (s.name, s.labels.get("key"), s.labels.get("priority")): s.value
        for family in text_string_to_metric_families(metrics)
        for s in family.samples
        if s.name.startswith("llmgw_queue_")
    }
    assert samples[("llmgw_queue_waiting", flooder, "batch")] == 2
    assert samples[("llmgw_queue_oldest_wait_seconds", flooder, "batch")] >= 0.1

    assert top.problems == []
    top_waiting = [(w.model, w.key, w.priority, w.waiting) for w in top.waiting]
    assert [w for w in top_waiting if w[1] != busy] == [
        (MODEL, chatter, "interactive", 1),
        (MODEL, flooder, "batch", 2),
    ]
    assert all(w.oldest_s is not None and w.oldest_s >= 0.1 for w in top.waiting)
    assert top.replica_depths == {"smol-0": SLOTS}
    (counters,) = top.models
    assert counters.queue_refused == {"queue_full": 1}


async def test_a_gateway_with_the_queue_off_says_so(store: Store) -> None:
    async with running_gateway(store, FakeRouteSource(), settings(fair_queue=False)) as gw:
        queue = await queue_of(gw)
    assert queue == {
        "enabled": False,
        "waiting": [],
        "admitted": [],
        "refusals": [],
        "depths": [],
    }


async def test_the_oldest_wait_is_per_key_and_class_and_leaves_with_its_request() -> None:
    g, clock, _ = gate(replicas=1, depth=1)
    first = await g.enter(MODEL, "a", BATCH, 100, 1.0, 600, key_name="alice")
    clock.now = 1.0
    older = asyncio.create_task(g.enter(MODEL, "a", BATCH, 100, 1.0, 600, key_name="alice"))
    await asyncio.sleep(0.01)
    clock.now = 3.0
    newer = asyncio.create_task(g.enter(MODEL, "a", BATCH, 100, 1.0, 600, key_name="alice"))
    other = asyncio.create_task(g.enter(MODEL, "b", INTERACTIVE, 100, 1.0, 600, key_name="bob"))
    await asyncio.sleep(0.01)
    clock.now = 4.0
    assert g.oldest_waits() == {MODEL: {("alice", BATCH): 3.0, ("bob", INTERACTIVE): 1.0}}
    names = {f.name: f for f in AdmissionCollector(g).collect()}
    (bob,) = [
        s for s in names["llmgw_queue_oldest_wait_seconds"].samples if s.labels["key"] == "bob"
    ]
    assert (bob.labels["priority"], bob.value) == ("interactive", 1.0)
    older.cancel()  # alice's oldest leaves: her wait is now her next request's
    await asyncio.gather(older, return_exceptions=True)
    assert g.oldest_waits()[MODEL][("alice", BATCH)] == 1.0
    g.leave(first, None)  # bob's interactive request goes first
    await asyncio.wait_for(other, 1)
    assert g.oldest_waits() == {MODEL: {("alice", BATCH): 1.0}}
    newer.cancel()
    await asyncio.gather(newer, return_exceptions=True)
    assert g.oldest_waits() == {}
