"""What chats sharing their leading messages begin with, learned (gateway/prefix_tokens.py),
without a gateway: what identifies a leading part, what is learned, the spot checks, what turns
learning off, and the bounds."""

from __future__ import annotations

import pytest

from gateway import prefix_tokens
from gateway.prefix_tokens import (
    MISMATCHES_OFF,
    PrefixTokens,
    open_turn,
    open_turn_fields,
    prefix_key,
)

SYSTEM = {"role": "system", "content": "You answer for the otter sanctuary."}
LEAD = tuple(range(1, 21))  # what every chat below begins with: 20 ids


def chat(question: str, **extra: object) -> dict[str, object]:
    return {"model": "m", "messages": [SYSTEM, {"role": "user", "content": question}], **extra}


def key_of(body: dict[str, object]) -> bytes | None:
    opened = open_turn(body)
    assert opened is not None
    return prefix_key(open_turn_fields(body, opened))


def test_the_key_is_the_leading_part_and_what_shapes_its_rendering() -> None:
    assert key_of(chat("how many otters?")) == key_of(chat("what do they eat?", max_tokens=5))
    assert key_of(chat("q", tools=[{"type": "function"}])) != key_of(chat("q"))
    assert key_of(chat("q", chat_template_kwargs={"x": 1})) != key_of(chat("q"))
    assert key_of(chat("q", model="m:adapter")) != key_of(chat("q"))
    other: dict[str, object] = {
        "model": "m",
        "messages": [{"role": "system", "content": "Other."}, SYSTEM],
    }
    assert key_of(other) != key_of(chat("q"))
    # The last message's role opens its turn: a part.
    assistant_last: dict[str, object] = {
        "model": "m",
        "messages": [SYSTEM, {"role": "assistant", "content": "q"}],
    }
    assert key_of(assistant_last) != key_of(chat("q"))


def test_the_opened_turn_is_the_chat_with_its_last_content_empty() -> None:
    body = chat("how many otters?", add_generation_prompt=True, temperature=0.2, tools=[1])
    opened = open_turn(body)
    assert opened == [SYSTEM, {"role": "user", "content": ""}]
    assert open_turn_fields(body, opened) == {
        "model": "m",
        "messages": opened,
        "tools": [1],
        "add_generation_prompt": False,
    }
    assert open_turn({"messages": [SYSTEM]}) is None
    assert open_turn({"messages": [SYSTEM, "not a message"]}) is None
    assert open_turn({"prompt": "text"}) is None


def test_what_both_begin_with_is_learned() -> None:
    book = PrefixTokens()
    # The opened turn ends with the empty content's closing (99); the whole chat goes on.
    assert book.learn("m", b"k", (*LEAD, 99), (*LEAD, 7, 8, 99))
    assert book.get(b"k") == LEAD
    assert book.learns("m")


def test_too_little_in_common_is_not_learned_and_counts_against_the_model() -> None:
    book = PrefixTokens()
    for n in range(MISMATCHES_OFF):
        assert book.learns("m")
        # A template that renders the last message first shares only its role's opening.
        assert not book.learn("m", f"k{n}".encode(), (5, 99, *LEAD), (5, 7, 8, 99, *LEAD))
        assert book.get(f"k{n}".encode()) is None
    assert not book.learns("m")
    assert book.learns("other")


def test_nothing_is_learned_that_the_whole_prompt_does_not_go_on_past() -> None:
    book = PrefixTokens()
    assert not book.learn("m", b"k", (*LEAD, 9), LEAD)
    assert book.get(b"k") is None


def test_a_spot_check_drops_what_a_chat_did_not_begin_with() -> None:
    book = PrefixTokens()
    # Learned from a question that began like the empty content's rendering (7).
    assert book.learn("m", b"k", (*LEAD, 7, 99), (*LEAD, 7, 8, 99))
    assert book.check("m", b"k", (*LEAD, 7, 3, 99))
    assert not book.check("m", b"k", (*LEAD, 4, 99))
    assert book.get(b"k") is None
    assert book.tokens == 0


def test_every_sixteenth_use_is_spot_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    book = PrefixTokens()
    due = [book.spot_check_due() for _ in range(32)]
    assert [n for n, d in enumerate(due, 1) if d] == [16, 32]
    monkeypatch.setattr(prefix_tokens, "SPOT_CHECK_EVERY", 2)
    assert [book.spot_check_due() for _ in range(4)] == [False, True, False, True]


def test_a_part_is_worth_learning_the_second_time_it_is_seen() -> None:
    book = PrefixTokens(seen_keys=2)
    assert not book.seen_before(b"a")
    assert book.seen_before(b"a")
    assert not book.seen_before(b"b")
    assert not book.seen_before(b"c")  # the oldest, b"a", is forgotten
    assert not book.seen_before(b"a")


def test_the_token_ids_kept_are_bounded_least_recently_used_first() -> None:
    book = PrefixTokens(max_tokens=50)
    a, b, c = tuple(range(20)), tuple(range(100, 120)), tuple(range(200, 220))
    assert book.learn("m", b"a", (*a, -1), (*a, 0))
    assert book.learn("m", b"b", (*b, -1), (*b, 0))
    assert book.get(b"a") is not None  # now the most recently used
    assert book.learn("m", b"c", (*c, -1), (*c, 0))
    assert book.get(b"b") is None
    assert book.get(b"a") == a
    assert book.get(b"c") == c
    assert book.tokens == 40
    assert len(book) == 2
    # A part larger than the whole book is not kept, and evicts nothing.
    huge = tuple(range(60))
    assert not book.learn("m", b"huge", (*huge, -1), (*huge, 0))
    assert len(book) == 2
