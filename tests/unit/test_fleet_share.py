"""The share of a model's slots each gateway may fill when several queue for it
(gateway/admission/fleet_share.py): a key that spreads its requests over gateways weighs what it
weighs on one, a gateway alone is not held back, stale reports count for nothing, weights
count, and two gateways' shares in whole slots never leave a slot idle."""

from __future__ import annotations

import asyncio

import pytest

from gateway.admission import AdmissionGate, QueuePolicy, ReplicaDepths
from gateway.admission.fleet_share import (
    FleetView,
    Report,
    fleet_view,
    fresh,
    gateway_demands,
    key_parts,
    share,
    slots,
)
from tests.gateway_kit import route


def test_a_flood_on_two_gateways_gives_the_one_with_the_interactive_keys_the_larger_share() -> None:
    # The flood has 20 requests on each gateway; three interactive keys one each, on the first.
    first = {
        "flood": (1.0, 16, 4),
        "chat-a": (1.0, 1, 0),
        "chat-b": (1.0, 0, 1),
        "chat-c": (1.0, 1, 0),
    }
    second = {"flood": (1.0, 17, 3)}
    mine, theirs = share(first, [second]), share(second, [first])
    assert mine is not None
    assert theirs is not None
    assert mine == pytest.approx(3.5 / 4)
    assert theirs == pytest.approx(0.5 / 4)
    assert mine + theirs == pytest.approx(1.0)
    # Within the first gateway the flood queues with half its weight: it gets 1/8 of the slots
    # there and 1/8 on the second, a quarter in all, as each interactive key does.
    parts = key_parts(first, [second])
    assert parts == {"flood": pytest.approx(0.5)}
    flood_here = mine * parts["flood"] / (parts["flood"] + 3)
    assert flood_here + theirs == pytest.approx(0.25)


def test_a_key_spread_over_two_gateways_weighs_once_in_all() -> None:
    # Counted at its full weight on each gateway, the flood would weigh 2 against the three
    # interactive keys' 3; split by its requests on each, it weighs 1/2 + 1/2.
    first = {"flood": (1.0, 10, 0), "a": (1.0, 1, 0), "b": (1.0, 1, 0), "c": (1.0, 1, 0)}
    second = {"flood": (1.0, 10, 0)}
    assert gateway_demands([first, second]) == pytest.approx([3.5, 0.5])
    assert sum(gateway_demands([first, second])) == pytest.approx(4.0)


def test_a_gateway_alone_gets_no_share() -> None:
    assert share({"flood": (1.0, 50, 4)}, []) is None
    assert fleet_view({"m": {"flood": (1.0, 50, 4)}}, []) == FleetView()


def test_no_share_while_no_other_gateway_has_requests_waiting() -> None:
    # The other gateway runs requests but waits for nothing: this one may fill every free slot
    # (an idle fleet serves a flood at full speed).
    assert share({"flood": (1.0, 50, 4)}, [{"chat": (1.0, 0, 3)}]) is None
    # Once it has one waiting, the share holds.
    assert share({"flood": (1.0, 50, 4)}, [{"chat": (1.0, 1, 3)}]) == pytest.approx(0.5)


def test_waiting_here_alone_does_not_cap_this_gateway() -> None:
    # The other side of the same rule: this gateway waits, the other does not; this one has no
    # share, and the other (which sees this one waiting) has.
    here = {"flood": (1.0, 50, 4)}
    there = {"chat": (1.0, 0, 1)}
    assert share(here, [there]) is None
    assert share(there, [here]) == pytest.approx(0.5)


def test_stale_reports_are_ignored_and_this_gateways_own_report_too() -> None:
    reports = [
        Report("gw-1", 0.4, {"m": {"chat": (1.0, 2, 1)}}),
        Report("gw-2", 5.0, {"m": {"flood": (1.0, 90, 8)}}),  # stopped reporting
        Report("me", 0.1, {"m": {"flood": (1.0, 90, 8)}}),
    ]
    kept = fresh(reports, "me", max_age_s=1.5)
    assert [r.gateway for r in kept] == ["gw-1"]
    view = fleet_view({"m": {"flood": (1.0, 90, 8)}}, kept)
    assert view.share("m") == pytest.approx(0.5)
    # Every report stale: no share at all.
    assert fleet_view({"m": {"flood": (1.0, 90, 8)}}, fresh(reports[1:], "me", 1.5)) == FleetView()


def test_weights_are_respected() -> None:
    heavy = {"paid": (3.0, 5, 2)}
    light = {"free": (1.0, 5, 2)}
    assert share(heavy, [light]) == pytest.approx(0.75)
    assert share(light, [heavy]) == pytest.approx(0.25)
    # A key of weight 3 split 2:1 over two gateways: 2 here, 1 there.
    here = {"paid": (3.0, 4, 0), "free": (1.0, 3, 0)}
    there = {"paid": (3.0, 2, 0)}
    assert gateway_demands([here, there]) == pytest.approx([3.0, 1.0])
    assert key_parts(here, [there]) == {"paid": pytest.approx(2 / 3)}


def test_a_key_split_by_its_requests_on_each_gateway() -> None:
    here = {"k": (1.0, 6, 4)}  # 10 here
    there = [{"k": (1.0, 20, 0)}, {"k": (1.0, 0, 10)}]  # 30 elsewhere
    assert key_parts(here, there) == {"k": pytest.approx(0.25)}
    assert gateway_demands([here, *there]) == pytest.approx([0.25, 0.5, 0.25])


def test_a_key_new_here_is_counted_with_its_next_request() -> None:
    # It has 9 requests elsewhere and none here yet: its next one here weighs a tenth.
    parts = key_parts({}, [{"k": (1.0, 9, 0)}])
    assert parts == {"k": pytest.approx(0.1)}
    assert FleetView(parts={"m": parts}).key_part("m", "k") == pytest.approx(0.1)
    # Keys only this gateway has, and models nobody else reports, keep their whole weight.
    assert FleetView(parts={"m": parts}).key_part("m", "other") == 1.0
    assert FleetView().key_part("elsewhere", "k") == 1.0


def test_a_gateway_with_nothing_for_the_model_gets_a_share_of_nothing() -> None:
    # Its next request may still take one slot (slots() is at least one).
    mine = share({}, [{"flood": (1.0, 40, 8)}])
    assert mine == 0.0
    assert slots(0.0, 8) == 1


def test_odd_reports_do_not_break_the_sums() -> None:
    # A key with nothing waiting or admitted, a zero or negative weight (never sent, but a
    # report is read from a shared table): nothing divides by zero.
    assert share({"a": (0.0, 3, 0)}, [{"b": (0.0, 2, 0)}]) is None
    assert gateway_demands([{"a": (-1.0, 3, 0)}, {"a": (1.0, 0, 0)}]) == [0.0, 0.0]
    assert key_parts({"a": (1.0, 0, 0)}, [{"a": (1.0, 0, 0)}]) == {}


SLOT_CASES = [
    (0.875, 8, 7),
    (0.125, 8, 1),
    (0.75, 4, 3),
    (0.3, 4, 1),
    (0.375, 4, 2),
    (0.25, 5, 1),  # a flood's quarter of a depth learnt one above llama.cpp's 4 slots
    (0.01, 64, 1),
    (0.0, 8, 1),
    (1.0, 5, 5),
    (0.5, 5, 3),
]


@pytest.mark.parametrize(("fraction", "capacity", "expected"), SLOT_CASES)
def test_slots_round_to_the_nearest_and_at_least_one(
    fraction: float, capacity: int, expected: int
) -> None:
    assert slots(fraction, capacity) == expected


@pytest.mark.parametrize("capacity", [1, 2, 3, 4, 5, 8, 64])
@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.125, 0.25, 1 / 3, 0.4, 0.5, 0.6, 0.875])
def test_two_gateways_whole_slots_never_leave_one_idle(fraction: float, capacity: int) -> None:
    # Both wait at their caps: together they may fill every slot, and at most one more.
    both = slots(fraction, capacity) + slots(1 - fraction, capacity)
    assert capacity <= both <= capacity + 1


def test_the_view_covers_every_model_another_gateway_reports() -> None:
    mine = {"a": {"flood": (1.0, 10, 2)}}
    others = [
        Report("gw-1", 0.2, {"a": {"chat": (1.0, 1, 0)}, "b": {"chat": (1.0, 1, 0)}}),
        Report("gw-2", 0.3, {"b": {"flood": (1.0, 2, 2)}}),
    ]
    view = fleet_view(mine, others)
    assert view.share("a") == pytest.approx(0.5)
    # Nothing of this gateway's for b: its next request's share is nothing (one slot).
    assert view.share("b") == 0.0
    assert view.share("c") is None
    assert view.key_part("b", "flood") == pytest.approx(1 / 5)


# --- the gate with a share -----------------------------------------------------------------


async def test_the_gate_fills_its_share_of_the_slots_not_of_what_the_others_leave() -> None:
    # Eight slots, three of them held by another gateway's requests (the engine's gauges):
    # with 3/4 of the slots this gateway may hold six, but only five are free.
    shares = {"m": 0.75}
    g = gated(depth=8, others=3, shares=shares)
    assert g.room("m") == 5
    shares["m"] = 0.25
    assert g.room("m") == 2
    # A gateway already past its share admits nothing more until its requests end.
    passes = [await g.enter("m", "k", 2, 10, 1.0, 60) for _ in range(2)]
    shares["m"] = 0.125
    assert g.room("m") == -1
    for p in passes:
        g.leave(p, 10)
    assert g.room("m") == 1


async def test_the_gate_queues_a_key_with_its_part_of_the_weight_and_reports_the_whole() -> None:
    g = gated(depth=1, others=0, shares={}, parts={("m", "flood"): 0.25})
    running = await g.enter("m", "chat", 2, 100, 1.0, 60)
    flood = asyncio.create_task(g.enter("m", "flood", 2, 100, 2.0, 60))
    await asyncio.sleep(0.01)
    assert g.demand()["m"]["flood"] == (2.0, 1, 0)
    g.leave(running, 100)
    admitted = await asyncio.wait_for(flood, 1)
    assert admitted.ticket is not None
    assert admitted.ticket.weight == pytest.approx(0.5)
    g.leave(admitted, 100)


def gated(
    depth: int,
    others: int,
    shares: dict[str, float],
    parts: dict[tuple[str, str], float] | None = None,
) -> AdmissionGate:
    routes = [route("m-0", "http://127.0.0.1:9000")]
    depths = ReplicaDepths(ceiling=64, first=depth)
    depths.observe("m-0", running=depth, waiting=1, held_back=False)
    found = parts or {}
    return AdmissionGate(
        QueuePolicy(4, aging_s=0, max_per_key=100, deadlines_s=(60.0,) * 4),
        depths,
        lambda model: routes if model == "m" else [],
        lambda _replica, _now: others,
        fleet_share=shares.get,
        key_part=lambda model, key: found.get((model, key), 1.0),
    )
