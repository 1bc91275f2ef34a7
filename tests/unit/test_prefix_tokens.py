"""The learned leading messages of chats (gateway/prefix_tokens.py), without a gateway: what
identifies a leading part, what is kept, what turns learning off, and its bounds."""

from __future__ import annotations

from gateway.prefix_tokens import (
    MISMATCHES_OFF,
    PrefixTokens,
    leading_messages,
    prefix_fields,
    prefix_key,
)

SYSTEM = {"role": "system", "content": "You answer for the otter sanctuary."}


def chat(question: str, **extra: object) -> dict[str, object]:
    return {"model": "m", "messages": [SYSTEM, {"role": "user", "content": question}], **extra}


def key_of(body: dict[str, object]) -> bytes | None:
    leading = leading_messages(body)
    assert leading is not None
    return prefix_key(prefix_fields(body, leading))


def test_the_key_is_the_leading_messages_and_what_shapes_their_rendering() -> None:
    assert key_of(chat("how many otters?")) == key_of(chat("what do they eat?", max_tokens=5))
    assert key_of(chat("q", tools=[{"type": "function"}])) != key_of(chat("q"))
    assert key_of(chat("q", chat_template_kwargs={"x": 1})) != key_of(chat("q"))
    assert key_of(chat("q", model="m:adapter")) != key_of(chat("q"))
    other = {"model": "m", "messages": [{"role": "system", "content": "Other."}, SYSTEM]}
    assert key_of(other) != key_of(chat("q"))
    fields = prefix_fields(chat("q", add_generation_prompt=True, temperature=0.2), [SYSTEM])
    assert fields == {"model": "m", "messages": [SYSTEM], "add_generation_prompt": False}


def test_only_chats_with_leading_messages_have_them() -> None:
    assert leading_messages({"messages": [SYSTEM]}) is None
    assert leading_messages({"messages": [SYSTEM, "not a message"]}) is None
    assert leading_messages({"prompt": "text"}) is None
    assert leading_messages(chat("q")) == [SYSTEM]


def test_a_leading_part_is_kept_only_when_it_begins_the_whole_prompt() -> None:
    book = PrefixTokens()
    assert book.learn("m", b"k1", (1, 2, 3), (1, 2, 3, 4, 5))
    assert book.get(b"k1") == (1, 2, 3)
    # Rendered otherwise than in the whole prompt, or nothing after it: not kept.
    assert not book.learn("m", b"k2", (1, 9), (1, 2, 3))
    assert not book.learn("m", b"k3", (1, 2, 3), (1, 2, 3))
    assert book.get(b"k2") is None
    assert book.get(b"k3") is None
    assert book.learns("m")


def test_a_model_whose_template_keeps_disagreeing_is_no_longer_learned() -> None:
    book = PrefixTokens()
    for n in range(MISMATCHES_OFF):
        assert book.learns("mistral")
        book.learn("mistral", f"k{n}".encode(), (5, 6), (7, 5, 6, 8))
    assert not book.learns("mistral")
    assert book.learns("other")


def test_a_part_is_worth_learning_the_second_time_it_is_seen() -> None:
    book = PrefixTokens(seen_keys=2)
    assert not book.seen_before(b"a")
    assert book.seen_before(b"a")
    assert not book.seen_before(b"b")
    assert not book.seen_before(b"c")  # the oldest, b"a", is forgotten
    assert not book.seen_before(b"a")


def test_the_token_ids_kept_are_bounded_least_recently_used_first() -> None:
    book = PrefixTokens(max_tokens=10)
    assert book.learn("m", b"a", (1, 2, 3, 4), (1, 2, 3, 4, 0))
    assert book.learn("m", b"b", (5, 6, 7, 8), (5, 6, 7, 8, 0))
    assert book.get(b"a") is not None  # now the most recently used
    assert book.learn("m", b"c", (9, 10, 11, 12), (9, 10, 11, 12, 0))
    assert book.get(b"b") is None
    assert book.get(b"a") == (1, 2, 3, 4)
    assert book.get(b"c") == (9, 10, 11, 12)
    assert book.tokens == 8
    assert len(book) == 2
    # A part larger than the whole book is not kept, and evicts nothing.
    assert not book.learn("m", b"huge", tuple(range(11)), tuple(range(12)))
    assert len(book) == 2
