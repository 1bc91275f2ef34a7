"""The gateway's fair queue through real sockets, against an engine of two slots that reports
its running and waiting requests as llama-server does: a flooding key does not hold another
key's request behind its own, classes order the queue, a key's own bound and the queue's
deadline answer with statuses the `openai` client understands, and a client that leaves its
place in the queue is not billed."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
from aiohttp import web

from store import KeyLimits, Store
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
from tests.ports import free_port

SLOTS = 2


@dataclass
class SlotEngine:
    """Runs SLOTS requests at once, each for `hold_s`; the rest wait in its own arrival order,
    as llama-server's deferred tasks do. Notes which prompt started when."""

    hold_s: float = 0.3
    running: int = 0
    waiting: int = 0
    started: list[str] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(SLOTS))
    url: str = ""
    # Set: the engine holds each request until it is released, however long the test takes.
    gate: asyncio.Event | None = None

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        self.waiting += 1
        async with self.slots:
            self.waiting -= 1
            self.running += 1
            self.started.append(body["messages"][-1]["content"])
            try:
                await (self.gate.wait() if self.gate else asyncio.sleep(self.hold_s))
            finally:
                self.running -= 1
        usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
        message = {"role": "assistant", "content": "ok"}
        return web.json_response(
            {
                "object": "chat.completion",
                "choices": [{"index": 0, "message": message}],
                "usage": usage,
            }
        )

    async def metrics(self, _: web.Request) -> web.Response:
        text = (
            f"llamacpp:requests_processing {self.running}\n"
            f"llamacpp:requests_deferred {self.waiting}\n"
        )
        return web.Response(text=text)


@contextlib.asynccontextmanager
async def slot_engine(hold_s: float = 0.3) -> AsyncIterator[SlotEngine]:
    engine = SlotEngine(hold_s)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", engine.chat)
    app.router.add_get("/metrics", engine.metrics)
    async with serving(app) as url:
        engine.url = url
        yield engine


def settings(**overrides: Any) -> Any:
    return fast_settings(engine_scrape_interval_s=0.05, **overrides)


async def new_key(store: Store, **limits: Any) -> dict[str, str]:
    _, plaintext = await store.create_key(f"k-{uuid.uuid4().hex[:8]}", limits=KeyLimits(**limits))
    return {"Authorization": f"Bearer {plaintext}"}


async def ask(
    gw: Gateway,
    auth: dict[str, str],
    content: str,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}
    return await gw.client.post(
        "/v1/chat/completions", json=body, headers={**auth, **(headers or {})}
    )


async def queue_of(gw: Gateway) -> dict[str, Any]:
    """The gateway's queue as the console shows it."""
    response = await gw.client.get("/admin/v1/console")
    assert response.status_code == 200
    queue: dict[str, Any] = response.json()["gateway"]["queue"]
    return queue


async def until(check: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def flood_then_chat(
    store: Store, fair_queue: bool, scrape_s: float = 0.05
) -> tuple[list[str], list[int]]:
    """Twelve requests of one key, then one of another: the order the engine started them.
    The gateway reads the engine's gauges every `scrape_s`, the first time only then."""
    flood, chat = await new_key(store), await new_key(store)
    tuned = fast_settings(engine_scrape_interval_s=scrape_s, fair_queue=fair_queue)
    async with slot_engine() as engine:
        source = FakeRouteSource(route("smol-0", engine.url))
        async with running_gateway(store, source, tuned) as gw:
            await asyncio.sleep(0.2)  # the engine's gauges read while idle (at 50 ms)
            floods = [asyncio.create_task(ask(gw, flood, f"flood {i}")) for i in range(12)]
            await until(lambda: len(engine.started) >= 1)
            await asyncio.sleep(0.2)  # the flood's requests are all waiting somewhere
            answer = await ask(gw, chat, "chat")
            statuses = [r.status_code for r in await asyncio.gather(*floods)] + [answer.status_code]
            return engine.started, statuses


async def test_a_flooding_key_does_not_hold_another_keys_request_behind_its_own(
    store: Store,
) -> None:
    started, statuses = await flood_then_chat(store, fair_queue=True)
    assert statuses == [200] * 13
    # The flood's first four went before the gateway had learnt the engine's two slots (at
    # most two of them waited in the engine); the chat request went next, not thirteenth.
    assert started.index("chat") <= 6


async def test_before_the_engines_gauges_are_read_a_flood_sends_it_only_a_first_depth(
    store: Store,
) -> None:
    # A gateway just started (or a replica just ready) has not read the engine's gauges yet: a
    # scrape a minute away stands for that. The flood sends the engine four (FIRST_DEPTH: two
    # run, two wait in its arrival order), not all twelve; the chat request goes after those.
    started, statuses = await flood_then_chat(store, fair_queue=True, scrape_s=60)
    assert statuses == [200] * 13
    assert started.index("chat") == 4


async def test_without_the_fair_queue_it_waits_behind_the_whole_flood(store: Store) -> None:
    started, statuses = await flood_then_chat(store, fair_queue=False)
    assert statuses == [200] * 13
    assert started.index("chat") == 12


async def test_a_higher_class_is_served_first_and_a_class_above_the_key_is_a_400(
    store: Store,
) -> None:
    key = await new_key(store, top_priority="interactive")
    async with slot_engine() as engine:
        engine.gate = asyncio.Event()  # nothing finishes until both wait in the gateway
        source = FakeRouteSource(route("smol-0", engine.url))
        async with running_gateway(store, source, settings()) as gw:
            await asyncio.sleep(0.2)
            busy = [asyncio.create_task(ask(gw, key, f"busy {i}")) for i in range(4)]
            await until(lambda: len(engine.started) >= 2)
            batch = asyncio.create_task(ask(gw, key, "batch", priority="batch"))
            await asyncio.sleep(0.1)
            urgent = asyncio.create_task(
                ask(gw, key, "urgent", headers={"x-llmgw-priority": "interactive"})
            )
            for _ in range(250):
                waiting = {w["priority"] for w in (await queue_of(gw))["waiting"]}
                if {"batch", "interactive"} <= waiting:
                    break
                await asyncio.sleep(0.02)
            engine.gate.set()
            await asyncio.gather(*busy, batch, urgent)
            assert started_before(engine.started, "urgent", "batch")
            refused = await ask(gw, key, "too high", priority="critical")
            assert_openai_error(refused, 400, "priority_not_allowed")
            assert refused.json()["error"]["param"] == "priority"
            out_of_range = await ask(gw, key, "nonsense", priority=9)
            assert_openai_error(out_of_range, 400, "invalid_priority")
            # Neither reached the engine.
            assert "too high" not in engine.started
            assert "nonsense" not in engine.started


def started_before(started: list[str], first: str, then: str) -> bool:
    return started.index(first) < started.index(then)


async def test_the_openai_client_is_told_429_and_503_with_retry_after(store: Store) -> None:
    key = await new_key(store)
    async with slot_engine() as engine:
        # Held until the client has been answered: on a loaded machine a fixed hold could end,
        # and the queue drain, before the client's requests arrive.
        engine.gate = asyncio.Event()
        source = FakeRouteSource(route("smol-0", engine.url))
        tight = settings(queue_per_key=1, queue_deadline_s=0.5)
        async with running_gateway(store, source, tight) as gw:
            await asyncio.sleep(0.2)
            # Two run, and the learnt depth holds the rest here; a flood fills this key's place.
            running = [asyncio.create_task(ask(gw, key, f"run {i}")) for i in range(SLOTS + 2)]
            await until(lambda: len(engine.started) >= SLOTS)
            await asyncio.sleep(0.3)
            client = openai.AsyncOpenAI(
                api_key=key["Authorization"].removeprefix("Bearer "),
                base_url=f"{gw.url}/v1",
                max_retries=0,
            )
            statuses: dict[int, str] = {}
            for _ in range(3):
                try:
                    await client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": "more"}]
                    )
                except openai.APIStatusError as err:
                    statuses[err.status_code] = err.response.headers.get("retry-after", "")
            await client.close()
            engine.gate.set()
            await asyncio.gather(*running, return_exceptions=True)
    assert set(statuses) <= {429, 503}
    assert statuses, "the queue refused nothing"
    for retry_after in statuses.values():
        assert int(retry_after) >= 1


async def test_a_client_that_leaves_the_queue_is_not_billed_and_never_reaches_the_engine(
    store: Store,
) -> None:
    busy_key = await new_key(store)
    record, plaintext = await store.create_key(f"leaver-{uuid.uuid4().hex[:6]}")
    async with slot_engine(hold_s=0.6) as engine:
        source = FakeRouteSource(route("smol-0", engine.url))
        async with running_gateway(store, source, settings()) as gw:
            await asyncio.sleep(0.2)
            busy = [asyncio.create_task(ask(gw, busy_key, f"busy {i}")) for i in range(6)]
            await until(lambda: len(engine.started) >= SLOTS)
            leaving = asyncio.create_task(
                ask(gw, {"Authorization": f"Bearer {plaintext}"}, "leaver")
            )
            await asyncio.sleep(0.2)
            leaving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await leaving
            await asyncio.gather(*busy)
            await asyncio.sleep(0.3)  # usage is flushed every 0.1 s here
            rows = await store.usage(key_id=record.key_id)
    assert "leaver" not in engine.started
    assert sum(r.prompt_tokens + r.completion_tokens for r in rows) == 0


async def test_vllm_started_for_priorities_gets_the_class_and_no_other_engine_gets_the_field(
    store: Store,
) -> None:
    async with slot_engine(hold_s=0) as engine:
        vllm = route("smol-0", engine.url).model_copy(
            update={"engine": "vllm", "takes_priority": True}
        )
        async with running_gateway(store, FakeRouteSource(vllm), settings()) as gw:
            await ask(gw, gw.auth, "batch work", priority="batch")
            await ask(gw, gw.auth, "by header", headers={"x-llmgw-priority": "interactive"})
            await ask(gw, gw.auth, "default")
        sent_to_vllm = list(engine.bodies)
        engine.bodies.clear()
        llamacpp = route("smol-0", engine.url)
        async with running_gateway(store, FakeRouteSource(llamacpp), settings()) as gw:
            await ask(gw, gw.auth, "to llama.cpp", priority="batch")
    assert [b.get("priority") for b in sent_to_vllm] == [3, 1, 2]
    assert "priority" not in engine.bodies[0]


async def test_an_admitted_request_whose_replica_fails_goes_to_a_full_one_not_back_with_429(
    store: Store,
) -> None:
    """Its queue let it through for the dead replica's room; that replica fails it, and the
    only one left is at its slots: it waits in that engine rather than being refused."""
    async with slot_engine(hold_s=0.5) as engine:
        live = route("smol-0", engine.url).model_copy(update={"slots": 1})
        dead = route("smol-1", f"http://127.0.0.1:{free_port()}").model_copy(update={"slots": 1})
        async with running_gateway(store, FakeRouteSource(live, dead), settings()) as gw:
            answers = await asyncio.gather(*(ask(gw, gw.auth, f"q{i}") for i in range(2)))
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    assert sorted(engine.started) == ["q0", "q1"]
