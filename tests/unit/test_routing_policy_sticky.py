"""Sticky until saturated: under a TTFT target the replica holding a prompt's prefix keeps it
while the prompt tokens pending there stay within what it prefills in that time; past it, the
least pending tokens. With the target at 0, the request-count margin as before."""

from __future__ import annotations

from gateway.routing import (
    Decision,
    EngineLoadBoard,
    LoadSample,
    RequestKey,
    Router,
    RoutingSnapshot,
    Sent,
)
from gateway.routing.prefix_index import BLOCK_BYTES
from kv.hashes import block_ids
from kv.index import KvBlockIndex
from workflows.contracts import KvSource, ReplicaState, Route, RoutingTable

# Eight index blocks of shared system prompt: 512 tokens as the router counts cached ones.
SYSTEM = (b"You are the support assistant of a bicycle shop. Be brief. " * 40)[: 8 * BLOCK_BYTES]
PROMPT_TOKENS = 600  # so each follow-up has 600 - 512 = 88 tokens to prefill where it is held


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def route(replica_id: str, kv: KvSource | None = None) -> Route:
    return Route(
        replica_id=replica_id,
        model="m",
        node="n",
        endpoint=f"http://127.0.0.1:1/{replica_id}",
        engine="vllm" if kv else "llamacpp",
        state=ReplicaState.READY,
        kv=kv,
    )


def snapshot(*routes: Route) -> RoutingSnapshot:
    return RoutingSnapshot(RoutingTable(version=1, routes=list(routes)))


def ask(question: int, tokens: int = PROMPT_TOKENS, system: bytes = SYSTEM) -> RequestKey:
    return RequestKey("m", system + b"Q%d: which tyre?" % question, prompt_tokens=tokens)


def chosen(decision: Decision) -> str:
    assert decision.route is not None
    return decision.route.replica_id


def send(router: Router, snap: RoutingSnapshot, request: RequestKey) -> tuple[Decision, Sent]:
    """Choose and send, as the gateway does (gateway/replica_attempts.py)."""
    decision = router.choose(snap, request, {})
    assert decision.route is not None
    sent = router.sent(decision.route, request, 0, decision)
    assert sent is not None
    return decision, sent


def test_the_holder_keeps_the_prefix_until_its_pending_tokens_pass_the_limit() -> None:
    clock = Clock()
    # 1,000 tokens a second for 1 s: 1,000 tokens may wait at the holder, this request's included.
    router = Router(ttft_target_s=1.0, prefill_tokens_per_s=1000.0, clock=clock)
    snap = snapshot(route("r-0"), route("r-1"))
    first, first_sent = send(router, snap, ask(0))
    holder = chosen(first)
    other = "r-1" if holder == "r-0" else "r-0"
    assert (first.reason, first.uncached_tokens) == ("new_prefix", PROMPT_TOKENS)
    # 600 pending, then 88 more each: 688, 776, 864, 952 stay within 1,000.
    for n in range(1, 5):
        again, _ = send(router, snap, ask(n))
        assert (chosen(again), again.reason, again.uncached_tokens) == (holder, "prefix", 88)
    # 952 + 88 passes it: the next goes by load, its whole prompt to prefill there.
    over, _ = send(router, snap, ask(5))
    assert (chosen(over), over.reason, over.uncached_tokens) == (other, "fallback_overloaded", 600)
    # The other replica holds the prefix now, and keeps it within its own limit.
    spread, _ = send(router, snap, ask(6))
    assert (chosen(spread), spread.reason) == (other, "prefix")
    # The holder's first request starts streaming: its 600 tokens are prefilled, room again.
    clock.now = 0.5
    router.started(first_sent)
    back, _ = send(router, snap, ask(7))
    assert (chosen(back), back.reason) == (holder, "prefix")


def test_with_the_target_at_zero_the_request_count_margin_decides() -> None:
    snap = snapshot(route("r-0"), route("r-1"))
    today = Router(ttft_target_s=0.0)
    holder = chosen(today.choose(snap, ask(0), {}))
    other = "r-1" if holder == "r-0" else "r-0"
    # 5 requests in flight there against none: past the margin.
    decision = today.choose(snap, ask(1), {holder: 5})
    assert (chosen(decision), decision.reason) == (other, "fallback_overloaded")
    assert today.sent(route(other), ask(2), 0, decision) is None, "no tokens counted"
    # Under a target the same counts do not decide: none of those requests is waiting for its
    # prefill as far as this router knows, so the holder keeps the prefix.
    sticky = Router(ttft_target_s=1.0, prefill_tokens_per_s=1000.0)
    holder = chosen(sticky.choose(snap, ask(0), {}))
    decision = sticky.choose(snap, ask(1), {holder: 5})
    assert (chosen(decision), decision.reason) == (holder, "prefix")


def test_an_idle_holder_takes_a_prompt_longer_than_its_limit() -> None:
    router = Router(ttft_target_s=0.1, prefill_tokens_per_s=1000.0)  # 100 tokens
    snap = snapshot(route("r-0"), route("r-1"))
    first, first_sent = send(router, snap, ask(0))
    router.started(first_sent)
    long = router.choose(snap, ask(1, tokens=5000), {})
    assert (chosen(long), long.reason, long.uncached_tokens) == (chosen(first), "prefix", 4488)


def saturated(router: Router, snap: RoutingSnapshot) -> tuple[str, str, str]:
    """The first request's replica, 990 tokens pending there (its whole prompt): with 1,000 a
    second for 1 s a follow-up's 88 pass its limit. Then the two other replicas."""
    holder = chosen(send(router, snap, ask(0, tokens=990))[0])
    first, second = [r for r in ("r-0", "r-1", "r-2") if r != holder]
    return holder, first, second


def wait_at(router: Router, replica_id: str, tokens: int) -> None:
    """Another prompt's `tokens` wait to be prefilled at the replica."""
    router.sent(route(replica_id), RequestKey("m", b"another prompt", prompt_tokens=tokens), 0)


def test_a_saturated_holder_is_kept_while_the_others_would_be_no_quicker() -> None:
    router = Router(ttft_target_s=1.0, prefill_tokens_per_s=1000.0)
    snap = snapshot(route("r-0"), route("r-1"), route("r-2"))
    holder, first, second = saturated(router, snap)
    # 500 wait at each other replica: 500 + the whole 600 there is 1.1 s, against the holder's
    # 990 + 88 = 1.078 s. The least pending tokens alone would have left the holder for 500.
    wait_at(router, first, 500)
    wait_at(router, second, 500)
    kept = router.choose(snap, ask(1), {first: 0, second: 0})
    assert (chosen(kept), kept.reason, kept.uncached_tokens) == (holder, "prefix", 88)


def test_a_saturated_holder_is_left_where_another_replica_would_be_quicker() -> None:
    router = Router(ttft_target_s=1.0, prefill_tokens_per_s=1000.0)
    snap = snapshot(route("r-0"), route("r-1"), route("r-2"))
    _, first, second = saturated(router, snap)
    wait_at(router, first, 400)  # 400 + 600: 1.0 s, against the holder's 1.078 s
    wait_at(router, second, 500)  # 1.1 s
    left = router.choose(snap, ask(1), {})
    assert (chosen(left), left.reason, left.uncached_tokens) == (
        first,
        "fallback_overloaded",
        600,
    )


def test_past_the_limit_equal_waits_go_to_the_fewest_requests() -> None:
    for busy_first in (False, True):
        router = Router(ttft_target_s=1.0, prefill_tokens_per_s=1000.0)
        snap = snapshot(route("r-0"), route("r-1"), route("r-2"))
        _, first, second = saturated(router, snap)
        # Both others would be done with the whole prompt in 0.6 s: the one with fewer requests
        # in flight (all started, nothing pending) gets it, whichever the cursor reaches first.
        busy, quiet = (first, second) if busy_first else (second, first)
        decision = router.choose(snap, ask(1), {busy: 3, quiet: 1})
        assert (chosen(decision), decision.reason) == (quiet, "fallback_overloaded")


def test_past_the_limit_a_replica_measured_slow_waits_longer_for_the_same_tokens() -> None:
    clock = Clock()
    router = Router(ttft_target_s=1.0, prefill_tokens_per_s=1000.0, clock=clock)
    snap = snapshot(route("r-0"), route("r-1"))
    holder = chosen(send(router, snap, ask(0, tokens=990))[0])
    other = "r-1" if holder == "r-0" else "r-0"
    router.tokens.observed(other, 1000, 5.0)  # 200 tokens a second there
    # Nothing pends at the other, but its 600 take it 3 s: the holder's 1,078 take 1.078 s.
    kept = router.choose(snap, ask(1), {})
    assert (chosen(kept), kept.reason) == (holder, "prefix")


def test_a_replica_measured_slow_is_left_sooner() -> None:
    clock = Clock()
    router = Router(ttft_target_s=1.0, prefill_tokens_per_s=1000.0, clock=clock)
    snap = snapshot(route("r-0"), route("r-1"))
    first, first_sent = send(router, snap, ask(0))
    clock.now = 3.0  # its 600 tokens took 3 s: 200 tokens a second, 200 may wait
    router.started(first_sent)
    assert router.tokens.limit(chosen(first)) == 200.0
    assert chosen(send(router, snap, ask(1))[0]) == chosen(first)  # 88 pending after it
    assert chosen(send(router, snap, ask(2))[0]) == chosen(first)  # 88 + 88 = 176
    third = router.choose(snap, ask(3), {})  # 264: past it, where 1,000 a second took 11
    assert (chosen(third) != chosen(first), third.reason) == (True, "fallback_overloaded")
    # Past the limit, the predicted wait with this request's own prefill: 264 at 200 a second
    # is 1.32 s at the holder, the whole 600 at the other's default 1,000 a second 0.6 s.


def test_another_gateways_requests_count_where_the_engine_shows_them() -> None:
    board = EngineLoadBoard(max_age_s=5.0)
    router = Router(ttft_target_s=1.0, prefill_tokens_per_s=1000.0, loads=board, clock=Clock())
    snap = snapshot(route("r-0"), route("r-1"))
    first, first_sent = send(router, snap, ask(0))
    router.started(first_sent)  # at once: too fast to be a prefill, no sample
    holder = chosen(first)
    # Two requests there that this gateway did not send, each taken as its mean prompt (600).
    board.record(holder, LoadSample(running=1, waiting=1, kv_usage=None, taken_at=0.0))
    decision = router.choose(snap, ask(1), {}, now=1.0)
    assert (chosen(decision) != holder, decision.reason) == (True, "fallback_overloaded")
    later = router.choose(snap, ask(2), {}, now=10.0)  # the sample is stale
    assert (chosen(later), later.reason) == (holder, "prefix")


def test_engines_reporting_their_blocks_are_held_to_the_limit_too() -> None:
    kv = KvSource(feed="http://n:9400", block_size=4, hash_seed="0")
    tokens = tuple(range(100, 122))  # 5 full blocks of 4
    index = KvBlockIndex()
    index.store("a", block_ids(tokens, 4, "0")[:2])
    index.store("b", block_ids(tokens, 4, "0")[:4])
    router = Router(kv_index=index, ttft_target_s=1.0, prefill_tokens_per_s=100.0)
    snap = snapshot(route("a", kv), route("b", kv), route("c", kv))
    request = RequestKey("m", b"prompt " * 10, token_ids=tokens, prompt_tokens=len(tokens))
    best = router.choose(snap, request, {})
    assert (chosen(best), best.reason, best.uncached_tokens) == ("b", "kv_prefix", 22 - 16)
    # A long prompt waits at b: the next holder, a, within its limit.
    router.sent(route("b", kv), RequestKey("m", b"long", prompt_tokens=99), 0)
    next_best = router.choose(snap, request, {})
    assert (chosen(next_best), next_best.reason, next_best.matched_blocks) == ("a", "kv_prefix", 2)
    router.sent(route("a", kv), RequestKey("m", b"long", prompt_tokens=99), 0)
    # Both holders past it: c, with nothing pending, though it holds nothing (its 22 tokens
    # take 0.22 s at 100 a second, b's 99 + 6 take 1.05 s).
    fallback = router.choose(snap, request, {})
    assert (chosen(fallback), fallback.reason) == ("c", "fallback_overloaded")
    # With as much pending at c, b's 105 tokens are the quickest: the holder is kept, saturated.
    router.sent(route("c", kv), RequestKey("m", b"long", prompt_tokens=99), 0)
    kept = router.choose(snap, request, {})
    assert (chosen(kept), kept.reason, kept.matched_blocks) == ("b", "kv_prefix", 4)


def test_the_baseline_policies_count_nothing() -> None:
    router = Router("least_load", ttft_target_s=1.0)
    assert not router.tokens.enabled
    decision = router.choose(snapshot(route("r-0")), ask(0), {})
    assert decision.uncached_tokens is None
    assert router.sent(route("r-0"), ask(0), 0, decision) is None
