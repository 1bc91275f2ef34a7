"""The admission gate as requests feel it: straight through while replicas have room, waiting in
fair order when they do not, and refused with a status and Retry-After past the queue's bound or
deadline; a client that leaves takes its request off the queue."""

from __future__ import annotations

import asyncio

import pytest

from gateway.admission import AdmissionGate, Pass, QueuePolicy, ReplicaDepths
from gateway.errors import ApiError
from tests.gateway_kit import route

MODEL = "smol"
BATCH, STANDARD, INTERACTIVE = 3, 2, 1


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def gate(
    replicas: int = 1, depth: int = 2, max_per_key: int = 100, deadline_s: float = 60
) -> tuple[AdmissionGate, Clock, list[str]]:
    routes = [route(f"smol-{i}", f"http://127.0.0.1:{9000 + i}") for i in range(replicas)]
    depths = ReplicaDepths(ceiling=64, first=depth)
    for r in routes:
        depths.observe(r.replica_id, running=depth, waiting=1, held_back=False)
    clock = Clock()
    refused: list[str] = []
    policy = QueuePolicy(4, aging_s=0, max_per_key=max_per_key, deadlines_s=(deadline_s,) * 4)
    made = AdmissionGate(
        policy,
        depths,
        lambda model: routes if model == MODEL else [],
        lambda _replica, _now: 0,
        clock=clock,
        refused=lambda _model, reason: refused.append(reason),
    )
    return made, clock, refused


async def enter(g: AdmissionGate, key: str, priority: int = STANDARD, cost: float = 100) -> Pass:
    return await g.enter(MODEL, key, priority, cost, 1.0, 600)


async def test_requests_pass_at_once_while_replicas_have_room() -> None:
    g, _, _ = gate(replicas=2, depth=2)
    passes = [await asyncio.wait_for(enter(g, "a"), 0.1) for _ in range(4)]
    assert all(p.waited_s == 0 for p in passes)
    assert g.room(MODEL) == 0
    fifth = asyncio.create_task(enter(g, "a"))
    await asyncio.sleep(0.05)
    assert not fifth.done()
    g.leave(passes[0], 50)
    assert (await asyncio.wait_for(fifth, 1)).model == MODEL


async def test_room_goes_to_the_next_key_in_fair_order_not_arrival_order() -> None:
    g, _, _ = gate(depth=1)
    running = await enter(g, "flood")
    flood = [asyncio.create_task(enter(g, "flood")) for _ in range(5)]
    await asyncio.sleep(0.01)
    chat = asyncio.create_task(enter(g, "chat"))
    await asyncio.sleep(0.01)
    g.leave(running, 100)
    # The flood's five arrived first; the chat key's one request still goes next.
    done = await asyncio.wait_for(chat, 1)
    assert not any(t.done() for t in flood[1:])
    g.leave(done, 100)
    for task in flood:
        g.leave(await asyncio.wait_for(task, 1), 100)


async def test_a_higher_class_goes_before_a_lower_one() -> None:
    g, _, _ = gate(depth=1)
    running = await enter(g, "a")
    batch = asyncio.create_task(enter(g, "b", BATCH))
    await asyncio.sleep(0.01)
    interactive = asyncio.create_task(enter(g, "c", INTERACTIVE))
    await asyncio.sleep(0.01)
    g.leave(running, 100)
    await asyncio.wait_for(interactive, 1)
    assert not batch.done()
    batch.cancel()


async def test_a_full_key_queue_is_429_with_retry_after() -> None:
    g, _, refused = gate(depth=1, max_per_key=2)
    await enter(g, "a")
    waiting = [asyncio.create_task(enter(g, "a")) for _ in range(2)]
    await asyncio.sleep(0.01)
    with pytest.raises(ApiError) as err:
        await enter(g, "a")
    assert err.value.status == 429
    assert err.value.code == "queue_full"
    assert int(err.value.headers["Retry-After"]) >= 1
    assert refused == ["queue_full"]
    # Another key is not held to the first key's bound.
    other = asyncio.create_task(enter(g, "b"))
    await asyncio.sleep(0.01)
    assert not other.done()
    for task in [*waiting, other]:
        task.cancel()


async def test_past_its_deadline_a_request_is_503_with_retry_after() -> None:
    g, clock, refused = gate(depth=1, deadline_s=5)
    await enter(g, "a")
    late = asyncio.create_task(enter(g, "b"))
    await asyncio.sleep(0.01)
    clock.now = 6
    g.kick()
    with pytest.raises(ApiError) as err:
        await asyncio.wait_for(late, 1)
    assert err.value.status == 503
    assert err.value.code == "queue_timeout"
    assert int(err.value.headers["Retry-After"]) >= 1
    assert refused == ["queue_timeout"]


async def test_a_client_that_leaves_while_waiting_leaves_the_queue_at_once() -> None:
    g, _, _ = gate(depth=1)
    running = await enter(g, "a")
    gone = asyncio.create_task(enter(g, "b"))
    await asyncio.sleep(0.01)
    assert g.waiting() == {MODEL: {("b", STANDARD): 1}}
    gone.cancel()
    await asyncio.sleep(0)
    assert g.waiting() == {}
    nxt = asyncio.create_task(enter(g, "c"))
    await asyncio.sleep(0.01)
    g.leave(running, 100)
    await asyncio.wait_for(nxt, 1)  # the room went to the next one, not the one that left
    assert g.admitted() == {MODEL: 1}


async def test_a_model_without_a_ready_replica_queues_nothing() -> None:
    g, _, _ = gate()
    admitted = await asyncio.wait_for(g.enter("other", "a", STANDARD, 100, 1.0, 600), 0.1)
    g.leave(admitted, None)
    assert g.waiting() == {}
    assert g.admitted() == {}


async def test_off_it_lets_everything_through() -> None:
    g, _, _ = gate(depth=1)
    g.enabled = False
    passes = [await asyncio.wait_for(enter(g, "a"), 0.1) for _ in range(10)]
    assert g.admitted() == {}
    for p in passes:
        g.leave(p, None)


async def test_the_smallest_weight_a_key_may_have_does_not_break_the_order() -> None:
    """Any weight above 0 is a valid key limit; at 5e-324 a request's cost over it is infinite,
    and the queue's virtual time with it once that key's second request is served: every
    other key's requests would then tie, in arrival order."""
    g, _, _ = gate(depth=1)
    running = await enter(g, "a")
    for _ in range(2):
        tiny = asyncio.create_task(g.enter(MODEL, "tiny", STANDARD, 100, 5e-324, 600))
        await asyncio.sleep(0.01)
        g.leave(running, None)
        running = await asyncio.wait_for(tiny, 1)
    later = asyncio.create_task(enter(g, "b"))
    await asyncio.sleep(0.01)
    g.leave(running, None)
    admitted = await asyncio.wait_for(later, 1)
    assert admitted.ticket is not None
    assert admitted.ticket.start_tag < float("inf")
