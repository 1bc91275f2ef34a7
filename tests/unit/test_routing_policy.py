"""The router's choice: prefix affinity, overload fallback, sessions, breakers, baselines."""

from __future__ import annotations

from collections import Counter

import pytest

from gateway.routing import (
    REASONS,
    CircuitBreaker,
    EngineLoadBoard,
    LoadSample,
    OverloadMargin,
    RequestKey,
    Router,
    RoutingSnapshot,
    prompt_bytes,
)
from gateway.routing.prefix_index import BLOCK_BYTES
from workflows.contracts import ReplicaState, Route, RoutingTable

SYSTEM_A = b"You are the support assistant of a bicycle shop. Be brief. " * 25
SYSTEM_B = b"You summarise clinical trial reports for physicians. " * 25


def route(replica_id: str, state: ReplicaState = ReplicaState.READY) -> Route:
    return Route(
        replica_id=replica_id,
        model="m",
        node="n",
        endpoint=f"http://127.0.0.1:1/{replica_id}",
        engine="llamacpp",
        state=state,
    )


def snapshot(*replica_ids: str) -> RoutingSnapshot:
    return RoutingSnapshot(RoutingTable(version=1, routes=[route(r) for r in replica_ids]))


def ask(prompt: bytes, session: str | None = None) -> RequestKey:
    return RequestKey(model="m", prompt=prompt, session=session)


def chosen(decision: object) -> str:
    route_ = getattr(decision, "route", None)
    assert route_ is not None
    return str(route_.replica_id)


def test_requests_sharing_a_system_prompt_follow_the_replica_that_served_it() -> None:
    router = Router()
    snap = snapshot("r-0", "r-1", "r-2")
    first = router.choose(snap, ask(SYSTEM_A + b"Q: my chain slips"), {}, now=0.0)
    assert first.reason == "new_prefix"
    assert first.matched_blocks == 0
    other = router.choose(snap, ask(SYSTEM_B + b"Summarise trial 7"), {}, now=1.0)
    assert chosen(other) != chosen(first), "ties rotate: a new prefix goes elsewhere"
    # Busy or not (within the margin), the replica holding the prefix gets the follow-ups.
    for n in range(5):
        inflight = {chosen(first): 3}
        again = router.choose(snap, ask(SYSTEM_A + b"Q: tyre size %d" % n), inflight, now=2.0)
        assert (chosen(again), again.reason) == (chosen(first), "prefix")
        assert again.matched_blocks == len(SYSTEM_A) // BLOCK_BYTES


def test_an_overloaded_holder_is_passed_over_and_the_prefix_spreads() -> None:
    router = Router(margin=OverloadMargin(absolute=4, factor=2.0))
    snap = snapshot("r-0", "r-1")
    holder = chosen(router.choose(snap, ask(SYSTEM_A + b"hello"), {}, now=0.0))
    other = "r-1" if holder == "r-0" else "r-0"
    # 4 more than the least loaded is within the margin; 5 is not.
    within = router.choose(snap, ask(SYSTEM_A + b"again"), {holder: 4}, now=1.0)
    assert (chosen(within), within.reason) == (holder, "prefix")
    over = router.choose(snap, ask(SYSTEM_A + b"busy"), {holder: 5}, now=2.0)
    assert (chosen(over), over.reason) == (other, "fallback_overloaded")
    # The overflow replica now holds the prefix too: when both are busy alike, either is a hit.
    both = router.choose(snap, ask(SYSTEM_A + b"later"), {holder: 6, other: 6}, now=3.0)
    assert both.reason == "prefix"


def test_the_margin_is_relative_under_heavy_load() -> None:
    margin = OverloadMargin(absolute=4, factor=2.0)
    assert not margin.exceeded(20, 10)
    assert margin.exceeded(21, 10)
    assert not margin.exceeded(4, 0)
    assert margin.exceeded(5, 0)


def test_engine_reported_queues_count_but_stale_samples_do_not() -> None:
    board = EngineLoadBoard(max_age_s=5.0)
    router = Router(loads=board)
    snap = snapshot("r-0", "r-1")
    holder = chosen(router.choose(snap, ask(SYSTEM_A + b"x"), {}, now=0.0))
    # Another gateway's requests fill the holder's queue: this gateway has none in flight there.
    board.record(holder, LoadSample(running=2, waiting=8, kv_usage=None, taken_at=10.0))
    busy = router.choose(snap, ask(SYSTEM_A + b"y"), {}, now=11.0)
    assert busy.reason == "fallback_overloaded"
    assert chosen(busy) != holder
    later = router.choose(snap, ask(SYSTEM_A + b"z"), {}, now=16.0)
    assert later.reason == "prefix", "a 6 s old sample is ignored"


def test_requests_finished_since_the_last_sample_do_not_count_as_load() -> None:
    # This gateway had two requests on r-0 when its engine was last read; both have finished.
    # The sample alone would still show r-0 busy until the next scrape, and send a new
    # group elsewhere; read against the gateway's own count, r-0 is idle. (Prompts of one
    # block: too short to start a prefix, so load alone places them.)
    board = EngineLoadBoard(max_age_s=5.0)
    router = Router(loads=board)
    snap = snapshot("r-0", "r-1")
    board.record("r-0", LoadSample(running=2, waiting=0, kv_usage=None, taken_at=10.0, own=2))
    board.record("r-1", LoadSample(running=1, waiting=0, kv_usage=None, taken_at=10.0, own=1))
    picks = [
        chosen(router.choose(snap, ask(b"%d" % n * 200), {"r-1": 1}, now=10.5)) for n in range(3)
    ]
    assert picks == ["r-0", "r-0", "r-0"]
    # Another gateway's request still counts: r-0's engine had one this gateway did not send.
    board.record("r-0", LoadSample(running=3, waiting=0, kv_usage=None, taken_at=11.0, own=2))
    picks = [chosen(router.choose(snap, ask(b"new %d" % n * 50), {}, now=11.5)) for n in range(3)]
    assert picks == ["r-1", "r-1", "r-1"]


def test_a_short_shared_opening_does_not_pin_traffic() -> None:
    router = Router(min_match_blocks=2)
    snap = snapshot("r-0", "r-1")
    opening = b"<|system|>" + b"-" * (BLOCK_BYTES - 10)  # exactly one shared block
    picks = {chosen(router.choose(snap, ask(opening + b"%d" % n * 300), {})) for n in range(4)}
    assert picks == {"r-0", "r-1"}


def test_sessions_stick_and_a_departed_replica_moves_only_its_own() -> None:
    router = Router()
    four = snapshot("r-0", "r-1", "r-2", "r-3")
    sessions = [f"user-{n}" for n in range(200)]
    # Prompts shorter than a block: no prefix to match, so the session decides.
    before = {s: router.choose(four, ask(b"hi", s), {}) for s in sessions}
    assert {d.reason for d in before.values()} == {"session"}
    owners = {s: chosen(d) for s, d in before.items()}
    assert all(chosen(router.choose(four, ask(b"hey", s), {})) == owners[s] for s in sessions)
    spread = Counter(owners.values())
    assert len(spread) == 4
    assert min(spread.values()) > 20

    three = snapshot("r-0", "r-1", "r-3")
    after = {s: chosen(router.choose(three, ask(b"hi", s), {})) for s in sessions}
    moved = {s for s in sessions if after[s] != owners[s]}
    assert moved == {s for s in sessions if owners[s] == "r-2"}


def test_an_overloaded_session_replica_falls_back() -> None:
    router = Router()
    snap = snapshot("r-0", "r-1")
    home = chosen(router.choose(snap, ask(b"hi", "alice"), {}))
    moved = router.choose(snap, ask(b"hi", "alice"), {home: 9})
    assert moved.reason == "fallback_overloaded"
    assert chosen(moved) != home


def test_ejected_replicas_are_skipped_and_if_all_are_the_oldest_ejection_is_tried() -> None:
    breaker = CircuitBreaker(failures_to_open=1, open_s=5.0)
    router = Router(breaker=breaker)
    snap = snapshot("r-0", "r-1", "r-2")
    breaker.failed("r-1", 0.0)
    picks = {chosen(router.choose(snap, ask(b"x"), {}, now=1.0)) for _ in range(6)}
    assert picks == {"r-0", "r-2"}
    breaker.failed("r-2", 1.0)
    breaker.failed("r-0", 2.0)
    last_resort = router.choose(snap, ask(b"x"), {}, now=3.0)
    assert (chosen(last_resort), last_resort.reason) == ("r-1", "fallback_ejected")


def test_a_half_open_replica_gets_one_probe_only() -> None:
    breaker = CircuitBreaker(failures_to_open=1, open_s=5.0)
    router = Router(breaker=breaker)
    snap = snapshot("r-0", "r-1")
    breaker.failed("r-0", 0.0)
    # r-0 is half-open at t=5: round-robin ties send it one request, then it waits.
    picks = [chosen(router.choose(snap, ask(b"x"), {}, now=5.0)) for _ in range(4)]
    assert picks.count("r-0") == 1


def test_excluded_and_missing_replicas() -> None:
    router = Router()
    snap = snapshot("r-0", "r-1")
    assert chosen(router.choose(snap, ask(b"x"), {}, exclude={"r-0"})) == "r-1"
    nothing = router.choose(snap, ask(b"x"), {}, exclude={"r-0", "r-1"})
    assert nothing.route is None
    assert nothing.reason == "none"
    starting = RoutingSnapshot(RoutingTable(routes=[route("r-0", ReplicaState.LOADING)]))
    assert router.choose(starting, ask(b"x"), {}).reason == "none"


def test_baseline_policies_ignore_prefixes() -> None:
    snap = snapshot("r-0", "r-1", "r-2")
    rr = Router("round_robin")
    picks = [chosen(rr.choose(snap, ask(SYSTEM_A), {"r-0": 50})) for _ in range(6)]
    assert picks == ["r-0", "r-1", "r-2", "r-0", "r-1", "r-2"]
    least = Router("least_load")
    picks = [chosen(least.choose(snap, ask(SYSTEM_A), {"r-1": 1})) for _ in range(4)]
    assert picks == ["r-0", "r-2", "r-0", "r-2"]
    with pytest.raises(ValueError, match="unknown routing policy 'random'"):
        Router("random")


def test_retain_forgets_replicas_that_left_or_restarted() -> None:
    board = EngineLoadBoard()
    breaker = CircuitBreaker(failures_to_open=1)
    router = Router(loads=board, breaker=breaker)
    snap = snapshot("r-0", "r-1")
    holder = chosen(router.choose(snap, ask(SYSTEM_A), {}, now=0.0))
    breaker.failed(holder, 0.0)
    board.record(holder, LoadSample(1, 0, None, 0.0))
    survivor = "r-1" if holder == "r-0" else "r-0"
    router.retain(snapshot(survivor))
    assert router.index.longest_match(SYSTEM_A, [holder]) == {}
    assert breaker.known() == set()
    assert board.latest(holder, 0.0) is None


def test_reasons_are_a_small_fixed_set() -> None:
    assert set(REASONS) == {
        "kv_prefix",
        "prefix",
        "session",
        "new_prefix",
        "least_load",
        "round_robin",
        "fallback_overloaded",
        "fallback_ejected",
        "none",
    }


def test_prompt_bytes_keep_only_what_becomes_the_prompt() -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
    ]
    streamed = prompt_bytes({"model": "m", "stream": True, "max_tokens": 5, "messages": messages})
    plain = prompt_bytes({"messages": messages, "temperature": 0.2, "model": "m"})
    assert streamed == plain
    longer = prompt_bytes({"messages": [*messages, {"role": "assistant", "content": "Hello"}]})
    assert longer.startswith(plain)
    assert longer != plain
    swapped = prompt_bytes({"messages": [{"role": "system", "content": "You are terseHi"}]})
    assert swapped != plain
    with_tools = prompt_bytes({"messages": messages, "tools": [{"type": "function"}]})
    assert with_tools.endswith(plain)
    assert with_tools != plain
    parts = [{"type": "text", "text": "look"}]
    assert b"look" in prompt_bytes({"messages": [{"role": "user", "content": parts}]})
    assert prompt_bytes({"prompt": "Once upon"}) == b"Once upon"
