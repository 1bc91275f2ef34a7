"""A routing decision's state (exact, approximate, degraded, fallback) from its reason, its
route and what the gateway hears of the route's KV events; the rule that calls a cache
prediction incorrect; and the per-model book that says when a model's routing changed state,
with the clock turned by hand."""

from __future__ import annotations

import itertools
import logging

import pytest

from gateway.routing.decisions import REASONS, Reason
from gateway.routing.states import (
    STATES,
    WHYS,
    FeedState,
    Routed,
    RoutingState,
    StateBook,
    classify,
    expected_cache,
    reported_cached,
)
from workflows.contracts import KvSource, ReplicaState, Route

KV = KvSource(feed="http://agent:9/kv", block_size=16)


def vllm(kv: KvSource | None = KV) -> Route:
    return Route(
        replica_id="v-0",
        model="m",
        node="n",
        endpoint="http://e",
        engine="vllm",
        state=ReplicaState.READY,
        kv=kv,
    )


def llamacpp(slots: int | None = None) -> Route:
    return Route(
        replica_id="l-0",
        model="m",
        node="n",
        endpoint="http://e",
        engine="llamacpp",
        state=ReplicaState.READY,
        prompt_slots=slots,
    )


@pytest.mark.parametrize(
    ("reason", "route", "feed", "expected"),
    [
        ("kv_prefix", vllm(), "live", ("exact", "kv_events")),
        # An engine that publishes KV events, not heard: whatever the reason, the gateway
        # routed without what would have told it where the prompt is.
        ("kv_prefix", vllm(), "starting", ("degraded", "no_snapshot")),
        ("prefix", vllm(), "down", ("degraded", "feed_down")),
        ("least_load", vllm(), "down", ("degraded", "feed_down")),
        ("new_prefix", vllm(), None, ("degraded", "feed_down")),
        # Heard, but routed by the gateway's own record (no token ids) or no match at all.
        ("prefix", vllm(), "live", ("approximate", "sent_record")),
        ("new_prefix", vllm(), "live", ("approximate", "new_prefix")),
        ("session", vllm(), "live", ("approximate", "session")),
        ("least_load", vllm(), "live", ("fallback", "no_match")),
        # llama.cpp: no KV events; what the gateway sent where, or the slots it replays.
        ("prefix", llamacpp(), None, ("approximate", "sent_record")),
        ("prefix", llamacpp(slots=4), None, ("approximate", "slot_record")),
        ("session", llamacpp(), None, ("approximate", "session")),
        ("least_load", llamacpp(), None, ("fallback", "no_match")),
        # Load decided, whatever the feed.
        ("fallback_overloaded", vllm(), "down", ("fallback", "overloaded")),
        ("fallback_ejected", llamacpp(), None, ("fallback", "ejected")),
        ("none", None, None, ("fallback", "no_replica")),
    ],
)
def test_a_decision_under_the_prefix_policy_has_a_state_and_a_why(
    reason: Reason, route: Route | None, feed: FeedState | None, expected: tuple[str, str]
) -> None:
    assert classify(reason, route, feed) == Routed(*expected)  # type: ignore[arg-type]


def test_a_load_policy_is_fallback_whatever_the_feed() -> None:
    assert classify("round_robin", vllm(), "down", policy="round_robin") == Routed(
        "fallback", "policy"
    )
    assert classify("least_load", vllm(), "live", policy="least_load") == Routed(
        "fallback", "policy"
    )


def test_an_incomplete_shared_picture_degrades_what_the_record_chose_but_not_kv_events() -> None:
    for reason in ("prefix", "session", "new_prefix", "least_load"):
        assert classify(reason, llamacpp(), picture_complete=False) == Routed(
            "degraded", "peers_missing"
        )
    # The engine's own events hold what every gateway sent it.
    assert classify("kv_prefix", vllm(), "live", picture_complete=False) == Routed(
        "exact", "kv_events"
    )
    # A feed down says more than a missing peer.
    assert classify("prefix", vllm(), "down", picture_complete=False).why == "feed_down"


def test_every_reason_has_a_state_and_every_why_is_a_label_value() -> None:
    for reason in REASONS:
        for route in (vllm(), llamacpp(), llamacpp(4)):
            for feed in ("live", "starting", "down", None):
                routed = classify(reason, route, feed)
                assert (routed.state in STATES, routed.why in WHYS) == (True, True)
    assert all(why.isidentifier() and why.islower() for why in WHYS)


def test_a_prediction_is_incorrect_when_the_engine_holds_less_than_half_of_it() -> None:
    exact = expected_cache("exact", kv_tokens=48, prefix_blocks=0)
    assert exact is not None
    assert [exact.incorrect(n) for n in (0, 23, 24, 32, 48, 64)] == [
        True,
        True,
        False,
        False,
        False,
        False,
    ]
    # The gateway's record: 256-byte blocks, half of 64 tokens each expected at least.
    record = expected_cache("approximate", kv_tokens=0, prefix_blocks=3)
    assert record is not None
    assert (record.tokens, record.incorrect(95), record.incorrect(96)) == (192, True, False)
    # KV events' prediction comes first; nothing predicted, nothing to check.
    kv_first = expected_cache("exact", kv_tokens=10, prefix_blocks=3)
    assert kv_first is not None
    assert kv_first.tokens == 10
    assert expected_cache("fallback", kv_tokens=0, prefix_blocks=0) is None


def test_the_engines_cached_figure_is_its_usages_else_llama_servers_cache_n() -> None:
    details = b'{"usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 7}}'
    assert reported_cached(details + b', "timings": {"cache_n": 3}}') == 7
    older = b'{"usage": {"prompt_tokens": 9}, "timings": {"cache_n": 3, "prompt_n": 6}}'
    assert reported_cached(older) == 3
    assert reported_cached(b'{"usage": {"prompt_tokens": 9}}') is None


def note(book: StateBook, state: RoutingState, now: float, why: str = "") -> str | None:
    whys = {"exact": "kv_events", "approximate": "sent_record", "degraded": "feed_down"}
    change = book.note("m", Routed(state, why or whys.get(state, "no_match")), now)  # type: ignore[arg-type]
    return None if change is None else change.message()


def test_a_models_first_state_is_said_once() -> None:
    book = StateBook()
    assert note(book, "exact", 100.0) == (
        "routing of model m: exact (kv_events; 1 of 1 decisions in the last 20s)"
    )
    assert [note(book, "exact", 100.0 + i) for i in range(1, 30)] == [None] * 29


def test_one_odd_decision_among_many_changes_nothing() -> None:
    book = StateBook()
    note(book, "exact", 0.0)
    said = []
    for i in range(1, 200):
        now = i * 0.1
        state: RoutingState = "fallback" if i % 10 == 0 else "exact"
        said.append(note(book, state, now, "overloaded" if state == "fallback" else ""))
    assert said == [None] * 199


def test_a_feed_going_down_is_said_once_it_holds_most_decisions_and_its_return_too() -> None:
    book = StateBook()
    note(book, "exact", 0.0)
    for i in range(1, 100):
        assert note(book, "exact", i * 0.1) is None  # 10 a second, until 9.9 s
    said = [(i, m) for i in range(100, 400) if (m := note(book, "degraded", i * 0.1))]
    # The recent window is this 10 s bucket and the last: from 10 s to 20 s it holds the 100
    # exact decisions of the first, which degraded cannot outnumber two to one; at 20 s those
    # have left it.
    assert said == [
        (
            200,
            "routing of model m: exact -> degraded (feed_down; 101 of 101 decisions in the "
            "last 20s)",
        )
    ]
    back = [(i, m) for i in range(400, 700) if (m := note(book, "exact", i * 0.1))]
    assert [i for i, _ in back] == [500]
    assert back[0][1].startswith("routing of model m: degraded -> exact (kv_events;")


def test_changes_are_at_most_one_per_hold_even_when_the_traffic_flips() -> None:
    book = StateBook(hold_s=10.0)
    times = []
    for i in range(600):  # a minute, the state flipping every 2 s, 10 decisions a second
        now = i * 0.1
        state: RoutingState = "exact" if (i // 20) % 2 == 0 else "degraded"
        if note(book, state, now) is not None:
            times.append(now)
    assert times[0] == 0.0
    assert all(b - a >= 10.0 for a, b in itertools.pairwise(times))


def test_a_change_is_a_warning_where_knowledge_is_missing_or_load_overrode_the_cache() -> None:
    levels = {}
    for state, why in (
        ("degraded", "feed_down"),
        ("fallback", "overloaded"),
        ("fallback", "no_match"),
        ("approximate", "sent_record"),
    ):
        change = StateBook().note("m", Routed(state, why), 0.0)  # type: ignore[arg-type]
        assert change is not None
        levels[state, why] = change.level
    assert levels == {
        ("degraded", "feed_down"): logging.WARNING,
        ("fallback", "overloaded"): logging.WARNING,
        ("fallback", "no_match"): logging.INFO,
        ("approximate", "sent_record"): logging.INFO,
    }


def test_the_view_shows_the_last_minute_and_the_incorrect_rate() -> None:
    book = StateBook()
    for i in range(6):
        book.note("m", Routed("exact", "kv_events"), float(i))
    book.note("m", Routed("degraded", "feed_down"), 6.0)
    book.note("m", Routed("approximate", "sent_record"), 50.0)
    book.checked("m", "exact", incorrect=False, now=1.0)
    book.checked("m", "exact", incorrect=True, now=2.0)
    book.checked("m", "approximate", incorrect=True, now=50.0)
    book.checked("m", "approximate", incorrect=False, now=50.0)

    (row,) = book.view(now=55.0)
    # Quiet for 40 s, then one decision: it is all the recent window holds.
    assert (row["model"], row["state"], row["why"], row["for_s"]) == (
        "m",
        "approximate",
        "sent_record",
        5.0,
    )
    assert row["decisions"] == {"exact": 6, "approximate": 1, "degraded": 1, "fallback": 0}
    assert row["incorrect_rate"] == 0.5
    assert (row["predicted"]["exact"], row["incorrect"]["approximate"]) == (2, 1)

    # A minute later the window has moved past every decision; the totals since start stay.
    (later,) = book.view(now=115.0)
    assert later["decisions"] == dict.fromkeys(STATES, 0)
    assert later["incorrect_rate"] is None
    assert later["incorrect_rate_since_start"] == 0.5
    assert later["predicted_since_start"] == {
        "exact": 2,
        "approximate": 2,
        "degraded": 0,
        "fallback": 0,
    }


def test_memory_per_model_is_a_few_buckets() -> None:
    book = StateBook(bucket_s=10.0, buckets=6)
    for i in range(10_000):
        book.note("m", Routed("exact", "kv_events"), float(i))
    assert len(book._models["m"].buckets) == 6
