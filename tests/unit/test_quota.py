"""Per-key quotas: rpm and tpm windows, budgets per UTC period, and the guarantee that spend
equals usage and never passes the budget while engines respect max_tokens."""

from __future__ import annotations

import asyncio
import random
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.prompt_estimate import MEDIA_PART_TOKENS, estimate_prompt_tokens
from gateway.quota import (
    IN_FLIGHT_RETRY_S,
    Denied,
    QuotaBook,
    Reservation,
)


@dataclass(frozen=True)
class Limits:
    rpm: int | None = None
    tpm: int | None = None
    token_budget: int | None = None
    budget_period: str = "day"


def at(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> float:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp()


NOON = at(2025, 5, 1, 12)


def admitted(result: Reservation | Denied) -> Reservation:
    assert isinstance(result, Reservation), result
    return result


def denied(result: Reservation | Denied) -> Denied:
    assert isinstance(result, Denied), f"admitted {result.tokens} tokens"
    return result


def test_a_key_without_limits_is_never_refused_and_costs_no_memory() -> None:
    book = QuotaBook()
    for i in range(1_000):
        book.settle(admitted(book.reserve(f"k{i}", Limits(), 10**9, NOON)), 10**9)
    assert len(book) == 0


def test_rpm_slides_and_tells_when_the_oldest_request_leaves_the_window() -> None:
    book, limits = QuotaBook(), Limits(rpm=2)
    admitted(book.reserve("k", limits, 0, NOON))
    admitted(book.reserve("k", limits, 0, NOON + 10))
    refused = denied(book.reserve("k", limits, 0, NOON + 20))
    assert refused.reason == "rpm"
    assert refused.retry_after_s == pytest.approx(40)
    assert "2 requests per minute" in refused.message
    assert denied(book.reserve("k", limits, 0, NOON + 59.5)).retry_after_s == pytest.approx(0.5)
    admitted(book.reserve("k", limits, 0, NOON + 60))
    # Now the requests of NOON + 10 and NOON + 60 fill the window.
    assert denied(book.reserve("k", limits, 0, NOON + 61)).retry_after_s == pytest.approx(9)


def test_refused_requests_do_not_count_against_rpm() -> None:
    book, limits = QuotaBook(), Limits(rpm=1)
    admitted(book.reserve("k", limits, 0, NOON))
    for second in range(1, 60):
        denied(book.reserve("k", limits, 0, NOON + second))
    admitted(book.reserve("k", limits, 0, NOON + 60))


def test_keys_have_separate_windows() -> None:
    book, limits = QuotaBook(), Limits(rpm=1)
    admitted(book.reserve("a", limits, 0, NOON))
    admitted(book.reserve("b", limits, 0, NOON))
    denied(book.reserve("a", limits, 0, NOON))


def test_a_released_request_still_counts_as_a_request() -> None:
    book, limits = QuotaBook(), Limits(rpm=1, tpm=100)
    book.release(admitted(book.reserve("k", limits, 100, NOON)))
    assert denied(book.reserve("k", limits, 10, NOON + 1)).reason == "rpm"


def test_tpm_counts_reservations_then_actual_usage() -> None:
    book, limits = QuotaBook(), Limits(tpm=1_000)
    first = admitted(book.reserve("k", limits, 600, NOON))
    refused = denied(book.reserve("k", limits, 500, NOON + 5))
    assert refused.reason == "tpm"
    assert refused.retry_after_s == pytest.approx(55)
    book.settle(first, 300)  # it used less than it reserved: the difference is free again
    admitted(book.reserve("k", limits, 500, NOON + 5))
    denied(book.reserve("k", limits, 201, NOON + 6))
    admitted(book.reserve("k", limits, 500, NOON + 60))  # the first request left the window


def test_a_long_request_settling_after_its_minute_does_not_free_the_current_one() -> None:
    book, limits = QuotaBook(), Limits(tpm=1_000)
    slow = admitted(book.reserve("k", limits, 1_000, NOON))
    admitted(book.reserve("k", limits, 1_000, NOON + 60))
    book.settle(slow, 0)
    denied(book.reserve("k", limits, 1, NOON + 61))


def test_a_request_larger_than_tpm_is_told_waiting_will_not_help() -> None:
    refused = denied(QuotaBook().reserve("k", Limits(tpm=100), 101, NOON))
    assert (refused.reason, refused.retry_after_s) == ("tpm", None)


def test_settling_twice_counts_once() -> None:
    book, limits = QuotaBook(), Limits(token_budget=1_000)
    reservation = admitted(book.reserve("k", limits, 100, NOON))
    book.settle(reservation, 80)
    book.settle(reservation, 80)
    book.release(reservation)
    assert reservation.settled
    balance = book.balance("k", limits, NOON)
    assert balance is not None
    assert (balance.spent, balance.reserved, balance.left) == (80, 0, 920)


def test_a_budget_held_by_requests_in_flight_suggests_a_short_retry() -> None:
    book, limits = QuotaBook(), Limits(token_budget=1_000)
    first = admitted(book.reserve("k", limits, 600, NOON))
    refused = denied(book.reserve("k", limits, 500, NOON))
    assert (refused.reason, refused.retry_after_s) == ("budget", IN_FLIGHT_RETRY_S)
    book.settle(first, 600)
    refused = denied(book.reserve("k", limits, 500, NOON))
    assert refused.retry_after_s == pytest.approx(12 * 3600), "spent: wait for UTC midnight"
    admitted(book.reserve("k", limits, 400, NOON))


def test_the_daily_budget_resets_at_utc_midnight() -> None:
    book, limits = QuotaBook(), Limits(token_budget=100)
    book.settle(admitted(book.reserve("k", limits, 100, at(2025, 5, 1, 23, 59, 58))), 100)
    assert denied(book.reserve("k", limits, 1, at(2025, 5, 1, 23, 59, 59))).retry_after_s == 1
    admitted(book.reserve("k", limits, 100, at(2025, 5, 2)))


def test_the_monthly_budget_resets_on_the_first_of_the_next_month() -> None:
    book, limits = QuotaBook(), Limits(token_budget=100, budget_period="month")
    book.settle(admitted(book.reserve("k", limits, 100, at(2024, 12, 3))), 100)
    refused = denied(book.reserve("k", limits, 1, at(2024, 12, 31, 23)))
    assert refused.retry_after_s == pytest.approx(3600)
    admitted(book.reserve("k", limits, 100, at(2025, 1, 1)))
    # February is short: its budget resets on March 1st, 28 days later.
    book.settle(admitted(book.reserve("k", limits, 100, at(2025, 2, 1))), 100)
    refused = denied(book.reserve("k", limits, 1, at(2025, 2, 1)))
    assert refused.retry_after_s == pytest.approx(28 * 86_400)


def test_a_request_spanning_midnight_is_charged_to_the_day_it_was_admitted() -> None:
    book, limits = QuotaBook(), Limits(token_budget=100)
    late = admitted(book.reserve("k", limits, 100, at(2025, 5, 1, 23, 59)))
    early = admitted(book.reserve("k", limits, 100, at(2025, 5, 2)))
    assert book.settle(late, 100) == 0
    balance = book.balance("k", limits, at(2025, 5, 2, 0, 1))
    assert balance is not None
    assert (balance.spent, balance.reserved) == (0, 100)
    book.settle(early, 40)
    assert book.completion_cap("k", limits, 0, None, at(2025, 5, 2, 1)) == 60


def test_completion_cap_is_what_is_left_after_the_prompt() -> None:
    book, limits = QuotaBook(), Limits(token_budget=1_000)
    assert book.completion_cap("k", Limits(), 100, None, NOON) is None
    assert book.completion_cap("k", limits, 100, None, NOON) == 900
    assert book.completion_cap("k", limits, 100, 50, NOON) == 50
    assert book.completion_cap("k", limits, 100, 5_000, NOON) == 900
    admitted(book.reserve("k", limits, 700, NOON))
    assert book.completion_cap("k", limits, 100, None, NOON) == 200
    assert book.completion_cap("k", limits, 400, 50, NOON) == 0


def test_reserve_completion_clamps_max_tokens_to_the_budget() -> None:
    book, limits = QuotaBook(), Limits(token_budget=1_000)
    wants_more = admitted(book.reserve_completion("k", limits, 100, 5_000, NOON))
    assert (wants_more.max_tokens, wants_more.tokens) == (900, 1_000)
    assert denied(book.reserve_completion("k", limits, 0, 10, NOON)).reason == "budget"


def test_reserve_completion_keeps_what_the_client_asked_when_it_fits() -> None:
    book = QuotaBook()
    unlimited = admitted(book.reserve_completion("k", Limits(), 100, None, NOON))
    assert unlimited.max_tokens is None
    fits = admitted(book.reserve_completion("k", Limits(token_budget=10**6), 100, 200, NOON))
    assert (fits.max_tokens, fits.tokens) == (200, 300)


def test_reserve_completion_leaves_max_tokens_unset_when_the_context_is_the_limit() -> None:
    book, limits = QuotaBook(), Limits(token_budget=10**6)
    reservation = admitted(book.reserve_completion("k", limits, 100, None, NOON, 8_192))
    assert (reservation.max_tokens, reservation.tokens) == (None, 8_292)
    tight = admitted(book.reserve_completion("k2", Limits(token_budget=1_000), 100, None, NOON))
    assert tight.max_tokens == 900


def test_reserve_completion_fits_the_cap_into_the_tpm_window() -> None:
    book, limits = QuotaBook(), Limits(tpm=1_000, token_budget=10**6)
    reservation = admitted(book.reserve_completion("k", limits, 100, None, NOON))
    assert (reservation.max_tokens, reservation.tokens) == (900, 1_000)
    assert denied(book.reserve_completion("k", limits, 100, None, NOON)).reason == "tpm"


def test_an_engine_ignoring_max_tokens_is_charged_in_full_and_reported() -> None:
    book, limits = QuotaBook(), Limits(token_budget=1_000)
    reservation = admitted(book.reserve_completion("k", limits, 100, None, NOON))
    assert book.settle(reservation, 1_250) == 250
    balance = book.balance("k", limits, NOON)
    assert balance is not None
    assert (balance.spent, balance.left) == (1_250, 0)
    assert denied(book.reserve_completion("k", limits, 1, None, NOON)).reason == "budget"


def test_an_unknown_budget_period_is_an_error() -> None:
    with pytest.raises(ValueError, match="budget_period"):
        QuotaBook().reserve("k", Limits(token_budget=1, budget_period="week"), 1, NOON)


async def test_concurrent_requests_cannot_share_the_last_of_a_budget() -> None:
    book, limits = QuotaBook(), Limits(token_budget=500)
    rng = random.Random(7)
    settled: list[int] = []
    lowest_left: list[int] = []

    def observe() -> None:
        balance = book.balance("k", limits, NOON)
        assert balance is not None
        assert balance.spent + balance.reserved <= balance.budget
        lowest_left.append(balance.budget - balance.spent - balance.reserved)

    async def request() -> bool:
        result = book.reserve("k", limits, 100, NOON)
        if isinstance(result, Denied):
            return False
        await asyncio.sleep(rng.uniform(0, 0.005))
        observe()
        actual = rng.randint(0, 100)
        book.settle(result, actual)
        settled.append(actual)
        observe()
        return True

    outcomes = await asyncio.gather(*(request() for _ in range(50)))
    assert sum(outcomes) == 5
    assert min(lowest_left) >= 0
    balance = book.balance("k", limits, NOON)
    assert balance is not None
    assert (balance.spent, balance.reserved) == (sum(settled), 0)


_reserve = st.tuples(
    st.just("reserve"),
    st.integers(0, 300),  # the prompt estimate
    st.none() | st.integers(0, 500),  # the client's max_tokens
    st.floats(0, 1),  # how much of the estimate the real prompt is
    st.floats(0, 1),  # how much of max_tokens the engine generates
)
_settle = st.tuples(st.just("settle"), st.integers(0, 200), st.floats(0, 1))
_release = st.tuples(st.just("release"), st.integers(0, 200))
_tick = st.tuples(st.just("tick"), st.floats(0, 30))


@settings(max_examples=300, deadline=None)
@given(
    budget=st.integers(0, 3_000),
    tpm=st.none() | st.integers(1, 2_000),
    operations=st.lists(st.one_of(_reserve, _settle, _release, _tick), max_size=80),
)
def test_spend_equals_usage_and_stays_within_the_budget(
    budget: int, tpm: int | None, operations: list[tuple[object, ...]]
) -> None:
    book, limits = QuotaBook(), Limits(tpm=tpm, token_budget=budget)
    now = NOON
    open_: list[tuple[Reservation, int]] = []
    used = 0

    def settle(index: int, share: float) -> None:
        nonlocal used
        reservation, usage = open_.pop(index % len(open_))
        actual = int(usage * share)
        book.settle(reservation, actual)
        used += actual

    for operation in operations:
        match operation:
            case ("reserve", int(estimate), requested, float(prompt_share), float(reply_share)):
                assert requested is None or isinstance(requested, int)
                result = book.reserve_completion("k", limits, estimate, requested, now)
                if isinstance(result, Reservation):
                    assert result.max_tokens is not None
                    # An engine honouring max_tokens, with a prompt no longer than estimated.
                    usage = int(estimate * prompt_share) + int(result.max_tokens * reply_share)
                    open_.append((result, usage))
            case ("settle", int(index), float(share)) if open_:
                settle(index, share)
            case ("release", int(index)) if open_:
                reservation, _ = open_.pop(index % len(open_))
                book.release(reservation)
            case ("tick", float(seconds)):
                now += seconds
        balance = book.balance("k", limits, now)
        assert balance is not None
        assert balance.spent + balance.reserved <= budget
    while open_:
        settle(0, 1.0)
    balance = book.balance("k", limits, now)
    assert balance is not None
    assert (balance.spent, balance.reserved) == (used, 0)


def _words_and_punctuation(text: str) -> int:
    """A stand-in lower bound on real token counts: no tokenizer joins two words, or a word and
    a punctuation mark, into one token, so it makes at least this many."""
    return len(re.findall(r"\w+|[^\w\s]", text))


CHAT: dict[str, Any] = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
        {"role": "user", "content": "What's the capital of France? And of Peru, please?"},
        {"role": "assistant", "content": "Paris; Lima."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Thanks! Now: 2+2=? (one word)"}],
        },
    ],
}


def _texts(body: dict[str, Any]) -> list[str]:
    texts: list[str] = []
    for message in body["messages"]:
        content = message["content"]
        texts += [content] if isinstance(content, str) else [p["text"] for p in content]
    return texts


def test_a_chat_estimate_is_at_least_its_words_and_punctuation() -> None:
    assert estimate_prompt_tokens(CHAT) >= sum(_words_and_punctuation(t) for t in _texts(CHAT))


def test_a_multibyte_prompt_is_counted_in_bytes_not_characters() -> None:
    text = "東京の天気は 🌧️ Ça va, Zoë? Ελληνικά."
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    assert estimate_prompt_tokens(body) >= len(text.encode()) > len(text)
    assert estimate_prompt_tokens({"model": "m", "prompt": text}) >= len(text.encode())


def test_completion_prompts_and_embedding_inputs_in_every_shape() -> None:
    text = "The quick brown fox, it seems, jumps over the lazy dog. " * 20
    pieces = _words_and_punctuation(text)
    assert estimate_prompt_tokens({"prompt": text}) >= pieces
    assert estimate_prompt_tokens({"prompt": [text, text]}) >= 2 * pieces
    assert estimate_prompt_tokens({"input": text}) >= pieces
    assert estimate_prompt_tokens({"input": [text, text, text]}) >= 3 * pieces


def test_token_id_prompts_count_each_id_once() -> None:
    bare = estimate_prompt_tokens({})
    assert estimate_prompt_tokens({"prompt": [1, 2, 3]}) == bare + 3
    assert estimate_prompt_tokens({"input": [[1, 2, 3], [4, 5]]}) == bare + 5


def test_tool_definitions_count_against_the_prompt() -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city, in degrees Celsius.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    with_tool = estimate_prompt_tokens({**CHAT, "tools": [tool]})
    assert with_tool - estimate_prompt_tokens(CHAT) >= len(str(tool))


def test_an_image_counts_a_fixed_generous_amount_not_its_base64() -> None:
    image = "data:image/png;base64," + "A" * 1_000_000
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is in this picture?"},
                    {"type": "image_url", "image_url": {"url": image}},
                ],
            }
        ]
    }
    assert MEDIA_PART_TOKENS <= estimate_prompt_tokens(body) < MEDIA_PART_TOKENS + 100
