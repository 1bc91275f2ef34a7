"""The fair queue's order, as the keys waiting in it would notice: shares by tokens and weight,
classes first, aging so no class starves, deadlines, removal and bounds."""

from __future__ import annotations

from collections import Counter

import pytest

from gateway.admission import FairQueue, QueueFull, Ticket

CLASSES = 4
CRITICAL, INTERACTIVE, STANDARD, BATCH = range(CLASSES)


def ticket(
    key: str, priority: int = STANDARD, cost: float = 100, weight: float = 1, at: float = 0
) -> Ticket:
    return Ticket(key, priority, cost, weight, arrived=at, deadline=at + 60)


def drain(queue: FairQueue, now: float = 0) -> list[Ticket]:
    out = []
    while (t := queue.pop(now)) is not None:
        out.append(t)
    return out


def test_a_flooding_key_does_not_go_before_another_keys_next_request() -> None:
    queue = FairQueue(CLASSES, aging_s=0, max_per_key=1000)
    for _ in range(50):
        queue.push(ticket("flood"))
    queue.pop(0)  # the flood's first is being served
    queue.push(ticket("chat"))
    assert queue.pop(0).key_id == "chat"  # type: ignore[union-attr]


def test_shares_follow_tokens_not_requests() -> None:
    """A key sending requests ten times as large gets a tenth as many through."""
    queue = FairQueue(CLASSES, aging_s=0, max_per_key=1000)
    for _ in range(200):
        queue.push(ticket("big", cost=1000))
        queue.push(ticket("small", cost=100))
    served = Counter[str]()
    tokens = Counter[str]()
    for _ in range(110):
        t = queue.pop(0)
        assert t is not None
        served[t.key_id] += 1
        tokens[t.key_id] += int(t.cost)
    assert served["small"] == 100
    assert served["big"] == 10
    assert tokens["small"] == tokens["big"]


def test_weights_divide_tokens() -> None:
    queue = FairQueue(CLASSES, aging_s=0, max_per_key=1000)
    for _ in range(300):
        queue.push(ticket("gold", weight=3))
        queue.push(ticket("basic", weight=1))
    first = [queue.pop(0) for _ in range(200)]
    served = Counter(t.key_id for t in first if t is not None)
    assert served["gold"] == 150
    assert served["basic"] == 50


def test_what_a_request_really_used_moves_its_keys_turn() -> None:
    """Charged the estimate while waiting, then what it used: a key whose requests turned out
    ten times longer than estimated waits behind another key's ten."""
    queue = FairQueue(CLASSES, aging_s=0, max_per_key=1000)
    queue.push(ticket("long"))
    first = queue.pop(0)
    assert first is not None
    queue.settle("long", estimated=100, used=1000, weight=1)
    for _ in range(12):
        queue.push(ticket("short"))
    queue.push(ticket("long"))
    order = [t.key_id for t in drain(queue)]
    assert order.index("long") >= 9


def test_higher_classes_go_first() -> None:
    queue = FairQueue(CLASSES, aging_s=0, max_per_key=1000)
    queue.push(ticket("a", BATCH))
    queue.push(ticket("b", STANDARD))
    queue.push(ticket("c", CRITICAL))
    queue.push(ticket("d", INTERACTIVE))
    assert [t.key_id for t in drain(queue)] == ["c", "d", "b", "a"]


def test_a_waiting_batch_request_is_not_starved_by_a_stream_of_interactive_ones() -> None:
    queue = FairQueue(CLASSES, aging_s=10, max_per_key=1000)
    queue.push(ticket("batch", BATCH, at=0))
    served = []
    for second in range(60):
        queue.push(ticket("chat", INTERACTIVE, at=second))
        t = queue.pop(second)
        assert t is not None
        served.append((second, t.key_id))
    # Once it has waited 10 s it gets every fourth turn.
    assert next(s for s, key in served if key == "batch") == 13


def test_a_long_batch_backlog_takes_a_quarter_of_the_turns_not_all_of_them() -> None:
    """A sustained flood of batch requests, every one of them waiting past aging_s, against
    fresh interactive requests: the interactive ones still get three turns in four."""
    queue = FairQueue(CLASSES, aging_s=10, max_per_key=10_000)
    for _ in range(1000):
        queue.push(ticket("flood", BATCH, at=0))
    served = Counter[str]()
    for second in range(100, 200):
        queue.push(ticket("chat", INTERACTIVE, at=second))
        queue.push(ticket("chat", INTERACTIVE, at=second))
        for _ in range(2):
            t = queue.pop(second)
            assert t is not None
            served[t.key_id] += 1
    assert served["flood"] == 50
    assert served["chat"] == 150


def test_without_aging_a_lower_class_waits_while_a_higher_one_has_work() -> None:
    queue = FairQueue(CLASSES, aging_s=0, max_per_key=1000)
    queue.push(ticket("batch", BATCH, at=0))
    for second in range(100):
        queue.push(ticket("chat", INTERACTIVE, at=second))
        assert queue.pop(second).key_id == "chat"  # type: ignore[union-attr]


def test_deadlines_take_requests_off_the_queue() -> None:
    queue = FairQueue(CLASSES, aging_s=0, max_per_key=1000)
    early = Ticket("a", STANDARD, 100, 1, arrived=0, deadline=5)
    late = Ticket("b", STANDARD, 100, 1, arrived=0, deadline=50)
    queue.push(early)
    queue.push(late)
    assert queue.next_deadline() == 5
    assert queue.expired(4) == []
    assert queue.expired(6) == [early]
    assert len(queue) == 1
    assert queue.next_deadline() == 50
    assert queue.pop(6) is late


def test_a_removed_request_is_never_served_and_gives_its_turn_back() -> None:
    queue = FairQueue(CLASSES, aging_s=0, max_per_key=1000)
    gone = ticket("a", cost=10_000)
    queue.push(gone)
    assert queue.remove(gone) is True
    assert queue.remove(gone) is False
    queue.push(ticket("a"))
    queue.push(ticket("b"))
    # a's removed request does not push its next one back behind b's
    assert [t.key_id for t in drain(queue)] == ["a", "b"]


def test_each_key_and_class_has_its_bound() -> None:
    queue = FairQueue(CLASSES, aging_s=0, max_per_key=3)
    for _ in range(3):
        queue.push(ticket("a"))
    with pytest.raises(QueueFull):
        queue.push(ticket("a"))
    queue.push(ticket("a", BATCH))  # another class: its own bound
    queue.push(ticket("b"))  # another key: its own bound
    assert queue.depths() == {("a", STANDARD): 3, ("a", BATCH): 1, ("b", STANDARD): 1}
    queue.pop(0)
    queue.push(ticket("a"))  # room again once one left


def test_an_idle_key_earns_no_credit_for_its_idle_time() -> None:
    queue = FairQueue(CLASSES, aging_s=0, max_per_key=10_000)
    for _ in range(100):
        queue.push(ticket("busy"))
    for _ in range(100):
        queue.pop(0)
    # "late" was idle while busy was served 100 times; it does not now get 100 turns in a row.
    for _ in range(10):
        queue.push(ticket("busy"))
        queue.push(ticket("late"))
    order = [t.key_id for t in drain(queue)]
    assert order[:4].count("late") <= 2
