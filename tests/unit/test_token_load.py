"""Sticky until saturated, the arithmetic: prompt tokens pending per replica, the prefill rate
learnt from requests' first bytes, and the limit they make with the TTFT target."""

from __future__ import annotations

import pytest

from gateway.routing import EngineLoadBoard, LoadSample, RequestKey
from gateway.routing.token_load import MIN_TOKENS_PER_S, TokenLoad, prompt_tokens


def ask(tokens: int) -> RequestKey:
    return RequestKey("m", b"p" * 40, prompt_tokens=tokens)


def test_a_prompts_tokens_are_its_count_else_its_ids_else_a_quarter_of_its_bytes() -> None:
    assert prompt_tokens(RequestKey("m", b"x" * 4000, prompt_tokens=900)) == 900
    assert prompt_tokens(RequestKey("m", b"x" * 4000, token_ids=(1, 2, 3))) == 3
    # Ids of the chat's opening only: the rest of the prompt is in its bytes.
    opening = RequestKey("m", b"x" * 4000, token_ids=(1, 2, 3), leading_only=True)
    assert prompt_tokens(opening) == 1000
    assert prompt_tokens(RequestKey("m", b"x" * 4001)) == 1001


def test_pending_tokens_rise_when_sent_and_fall_when_started_or_finished() -> None:
    load = TokenLoad(ttft_target_s=1.0)
    first = load.sent("r", ask(500), 100, now=0.0)
    second = load.sent("r", ask(300), None, now=0.0)  # nothing predicted cached: all of it
    assert first is not None
    assert second is not None
    assert (load.pending("r", 0.0), load.pending("other", 0.0)) == (400, 0)
    load.started(first, now=0.5)
    assert load.pending("r", 0.5) == 300
    load.finished(first)  # a streamed request finishes after it started: counted off once
    assert load.pending("r", 0.6) == 300
    load.finished(second)  # failed before its first byte
    assert load.pending("r", 0.7) == 0
    load.started(second, now=0.8)  # late news of an ended request changes nothing
    assert load.pending("r", 0.8) == 0


def test_without_a_target_nothing_is_counted() -> None:
    load = TokenLoad(ttft_target_s=0.0)
    assert not load.enabled
    assert load.sent("r", ask(500), 100, now=0.0) is None
    assert load.pending("r", 0.0) == 0


def test_the_rate_is_the_default_until_a_request_times_the_replica() -> None:
    load = TokenLoad(ttft_target_s=1.0, default_tokens_per_s=1000.0)
    assert load.tokens_per_s("r") == 1000.0
    ticket = load.sent("r", ask(400), None, now=10.0)
    assert ticket is not None
    load.started(ticket, now=12.0)
    assert load.tokens_per_s("r") == pytest.approx(200.0)
    assert load.tokens_per_s("other") == 1000.0


def test_a_request_sent_behind_others_is_timed_with_their_tokens() -> None:
    load = TokenLoad(ttft_target_s=1.0, default_tokens_per_s=1000.0)
    ahead = load.sent("r", ask(300), None, now=0.0)
    behind = load.sent("r", ask(100), None, now=0.0)
    assert ahead is not None
    assert behind is not None
    load.started(ahead, now=1.0)  # 300 tokens in 1 s
    load.started(behind, now=2.0)  # its 100 after the 300 ahead: 400 in 2 s, not 100
    assert load.tokens_per_s("r") == pytest.approx((300 + 0.2 * 100) / (1 + 0.2 * 1))


def test_the_rate_follows_new_samples_smoothly_with_a_floor() -> None:
    load = TokenLoad(ttft_target_s=1.0, default_tokens_per_s=1000.0)
    load.observed("r", 1000, 1.0)
    assert load.tokens_per_s("r") == pytest.approx(1000.0)
    load.observed("r", 1000, 2.0)  # one slow request moves it a fifth of the way
    assert load.tokens_per_s("r") == pytest.approx(1000 / 1.2)
    for _ in range(40):
        load.observed("r", 1000, 2.0)
    assert load.tokens_per_s("r") == pytest.approx(500.0, rel=0.01)
    # A fully cached prompt on an idle replica times the engine's fixed cost, not its prefill;
    # a first byte at once is not a prefill's.
    load.observed("r", 10, 5.0)
    load.observed("r", 600, 0.0)
    load.observed("r", 600, 1e-6)
    assert load.tokens_per_s("r") == pytest.approx(500.0, rel=0.01)
    # A stall drags the rate to the floor and no further.
    for _ in range(40):
        load.observed("r", 100, 1000.0)
    assert load.tokens_per_s("r") == MIN_TOKENS_PER_S


def test_the_limit_is_the_rate_times_the_target_and_an_idle_holder_takes_anything() -> None:
    load = TokenLoad(ttft_target_s=0.5, default_tokens_per_s=1000.0)
    assert load.limit("r") == 500.0
    assert load.within("r", pending=300, uncached=200)
    assert not load.within("r", pending=301, uncached=200)
    # Nothing ahead: a prompt longer than the limit waits for no one there.
    assert load.within("r", pending=0, uncached=5000)
    load.observed("r", 400, 2.0)  # 200 tokens a second
    assert load.limit("r") == pytest.approx(100.0)


def test_other_senders_requests_count_at_the_mean_uncached_prompt_sent() -> None:
    board = EngineLoadBoard(max_age_s=5.0)
    load = TokenLoad(ttft_target_s=1.0, loads=board)
    load.sent("a", ask(100), None, now=0.0)
    load.sent("a", ask(200), None, now=0.0)  # the mean moves a fifth: 120
    board.record("b", LoadSample(running=1, waiting=2, kv_usage=None, taken_at=0.0))
    assert load.pending("b", 1.0) == 360
    assert load.pending("b", 6.0) == 0, "a stale sample counts nothing"
    # A request sent behind them is timed with their tokens too.
    ticket = load.sent("b", ask(100), None, now=1.0)
    assert ticket is not None
    assert ticket.ahead == 360


def test_a_replica_that_left_and_came_back_starts_afresh() -> None:
    load = TokenLoad(ttft_target_s=1.0, default_tokens_per_s=1000.0)
    old = load.sent("r", ask(400), None, now=0.0)
    load.observed("r", 400, 4.0)
    assert old is not None
    load.retain({"other"})
    assert (load.pending("r", 1.0), load.tokens_per_s("r")) == (0, 1000.0)
    load.sent("r", ask(50), None, now=1.0)
    load.finished(old)  # the old replica's request ends: the new one's count is its own
    assert load.pending("r", 2.0) == 50


def test_past_the_limit_the_quickest_counts_the_requests_own_prefill_at_each_rate() -> None:
    load = TokenLoad(ttft_target_s=1.0, default_tokens_per_s=1000.0)
    load.sent("holder", ask(900), None, now=0.0)
    load.sent("busy", ask(500), None, now=0.0)
    load.observed("slow", 1000, 5.0)  # 200 tokens a second, nothing pending
    # A 600-token prompt of which the holder has 512 cached: 900 + 88 there (0.988 s, within
    # its limit of 1,000 tokens), 500 + 600 at busy (1.1 s), 600 at 200 a second at slow (3 s).
    judged = load.judged(["holder", "busy", "slow"], 600, [512, 0, 0], now=0.0)
    assert judged.first_within([0]) == 0
    assert judged.quickest([0, 0, 0], start=1) == 0
    # 100 more at the holder pass its limit, and it is still the quickest (1.088 s).
    load.sent("holder", ask(100), None, now=0.0)
    judged = load.judged(["holder", "busy", "slow"], 600, [512, 0, 0], now=0.0)
    assert judged.first_within([0]) is None
    assert (judged.uncached(0), judged.quickest([0, 0, 0], start=1)) == (88, 0)
    # Were 100 of the prompt's tokens cached at busy, 500 + 500 there (1.0 s) would be quicker.
    judged = load.judged(["holder", "busy", "slow"], 600, [512, 100, 0], now=0.0)
    assert judged.quickest([0, 0, 0], start=0) == 1


def test_equal_waits_go_to_the_fewest_requests_then_from_the_start_on() -> None:
    load = TokenLoad(ttft_target_s=1.0, default_tokens_per_s=1000.0)
    judged = load.judged(["a", "b", "c"], 600, [0, 0, 0], now=0.0)
    assert judged.quickest([2, 1, 1], start=0) == 1
    assert judged.quickest([1, 1, 1], start=2) == 2
    assert judged.quickest([1, 1, 1], start=4) == 1  # the start wraps
