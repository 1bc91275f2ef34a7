"""Issue 35's faster per-request steps on large bodies, each compared with the implementation it
replaced on random and adversarial inputs: the answers must be the very same."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from gateway import json_body, prompt_estimate
from gateway.body_parse import INLINE_BYTES_PER_VALUE, INLINE_SIZE_FACTOR, few_values
from gateway.errors import ApiError
from gateway.json_body import (
    FIND_AT_MOST,
    FIND_FROM_BYTES,
    check_surrogates,
    count_byte,
    lone_surrogate_at,
)
from gateway.prompt_estimate import estimate_prompt_tokens
from gateway.routing.request_key import prompt_bytes

_NOT_STRUCTURAL = bytes(b for b in range(256) if b not in b",:[{")


def few_values_before(raw: bytes, inline_bytes: int) -> bool:
    """few_values as it was: the structural bytes counted by deleting every other byte."""
    if len(raw) > INLINE_SIZE_FACTOR * inline_bytes:
        return False
    return len(raw.translate(None, _NOT_STRUCTURAL)) < inline_bytes // INLINE_BYTES_PER_VALUE


@pytest.mark.parametrize("seed", range(40))
def test_few_values_answers_as_before_on_random_bodies(seed: int) -> None:
    rng = random.Random(seed)
    inline = rng.choice([0, 1, 8, 64, 256, 1024, 4096])
    # Mostly plain bytes, with structural ones at a density that puts the count near the bound.
    alphabet = b'a0 "\\' * rng.randint(1, 40) + b",:[{"
    for size in (0, 1, inline, inline + 1, 3 * inline, INLINE_SIZE_FACTOR * inline + 1):
        raw = bytes(rng.choice(alphabet) for _ in range(size))
        assert few_values(raw, inline) == few_values_before(raw, inline), (inline, size)


@pytest.mark.parametrize("inline", [64, 1024, 64 * 1024])
def test_few_values_answers_as_before_at_the_bound(inline: int) -> None:
    bound = inline // INLINE_BYTES_PER_VALUE
    filler = b"x" * (inline + 1)
    for byte in (b",", b":", b"{", b"["):
        for count in (bound - 2, bound - 1, bound, bound + 1, 2 * bound):
            for raw in (filler + byte * count, byte * count + filler):
                assert few_values(raw, inline) == few_values_before(raw, inline)
    mixed = filler + b"[0]," * (bound // 3) + b'{"a":0}' * (bound // 3)
    assert few_values(mixed, inline) == few_values_before(mixed, inline)


def test_few_values_sends_dense_bodies_to_a_worker() -> None:
    inline = 64 * 1024
    one_mb = INLINE_SIZE_FACTOR * inline
    dense = [
        b"[" + b"0," * (one_mb // 2 - 2) + b"0]",
        b"[" + b"[0]," * (one_mb // 4 - 2) + b"[0]]",
        b'{"a":' * (one_mb // 6) + b"0" + b"}" * (one_mb // 6),
        b'{"x":"' + b"a," * (one_mb // 2 - 8) + b'"}',
    ]
    for raw in dense:
        assert len(raw) <= one_mb
        assert not few_values(raw, inline)
        assert not few_values_before(raw, inline)


@pytest.mark.parametrize("seed", range(12))
def test_count_byte_counts_as_bytes_count_does(seed: int) -> None:
    # Large bodies find their first few by `find` and the rest by deleting: every count near the
    # switch, at both sizes, stopped at every limit near it, as bytes.count (bounded) gives it.
    rng = random.Random(seed)
    for size in (FIND_FROM_BYTES - 1, FIND_FROM_BYTES, 4 * FIND_FROM_BYTES):
        for count in (0, 1, FIND_AT_MOST - 1, FIND_AT_MOST, FIND_AT_MOST + 1, 500):
            data = bytearray(rng.choice(b"ab{[") for _ in range(size))
            for at in rng.sample(range(size), count):
                data[at] = ord(":")
            raw = bytes(data)
            for limit in (-1, 0, 1, FIND_AT_MOST - 1, FIND_AT_MOST, count, count + 1):
                expected = raw.count(b":") if limit < 0 else min(raw.count(b":"), limit)
                assert count_byte(raw, b":", limit) == expected, (size, count, limit)


def _surrogate_answer(raw: bytes) -> str | None:
    """What check_surrogates says of `raw` (the refusal's message, None when it passes)."""
    body = json.loads(raw)
    try:
        check_surrogates(raw, body)
    except ApiError as err:
        return err.message
    return None


@pytest.mark.parametrize("seed", range(12))
def test_the_ascii_walk_answers_as_the_pattern_does(seed: int) -> None:
    rng = random.Random(seed)
    escapes = ["\\ud83d\\ude00", "\\ud800", "\\udfff", "\\\\ud800", "\\u00e9", "\\n", "é"]
    messages = []
    for _ in range(rng.choice([1, 20, 100, 300])):
        words = [rng.choice(["word", "other", "text"]) for _w in range(rng.randint(5, 400))]
        if rng.random() < 0.02:
            words.insert(rng.randrange(len(words)), rng.choice(escapes))
        messages.append('{"role":"user","content":"' + " ".join(words) + '"}')
    raw = ('{"model":"m","messages":[' + ",".join(messages) + "]}").encode()
    body = json.loads(raw)
    where = lone_surrogate_at(body)
    answer = _surrogate_answer(raw)
    assert (answer is None) == (where is None)
    if where is not None:
        assert answer is not None
        assert f"'{where}'" in answer
    # The same answer whatever the walk's budget: it only decides whether the pattern runs.
    for per_value in (1, 64, 512, 2048, 1 << 30):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(json_body, "ASCII_WALK_BYTES_PER_VALUE", per_value)
            assert _surrogate_answer(raw) == answer


def estimate_before(body: dict[str, Any]) -> int:
    """estimate_prompt_tokens as it was: each message through a function, each field through
    _string_bytes (the rest of the estimate did not change)."""
    total = prompt_estimate.REQUEST_OVERHEAD_TOKENS
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            total += prompt_estimate.MESSAGE_OVERHEAD_TOKENS
            if isinstance(message, dict):
                for field, value in message.items():
                    if field == "content" and isinstance(value, list):
                        for part in value:
                            total += prompt_estimate._content_part_tokens(part)
                    else:
                        total += prompt_estimate._string_bytes(value)
    rest = {name: value for name, value in body.items() if name != "messages"}
    return total + estimate_prompt_tokens(rest) - prompt_estimate.REQUEST_OVERHEAD_TOKENS


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    kinds = ["ascii", "unicode", "surrogate", "int", "none", "bool", "float"]
    if depth < 3:
        kinds += ["list", "dict"]
    kind = rng.choice(kinds)
    if kind == "ascii":
        return "x" * rng.randint(0, 50)
    if kind == "unicode":
        return "é€😀" * rng.randint(1, 5)
    if kind == "surrogate":
        return "a\ud800b"
    if kind == "int":
        return rng.randint(-5, 5)
    if kind == "none":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "float":
        return rng.random()
    if kind == "list":
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    names = ["role", "content", "text", "refusal", "name", "tool_calls", "é", "type"]
    return {rng.choice(names): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


@pytest.mark.parametrize("seed", range(30))
def test_the_prompt_estimate_is_as_before(seed: int) -> None:
    rng = random.Random(seed)
    messages: list[Any] = []
    for _ in range(rng.randint(0, 30)):
        message = _random_value(rng, depth=1)
        if rng.random() < 0.6:
            message = {"role": rng.choice(["user", "assistant", "tool"]), "content": message}
        messages.append(message)
    body: dict[str, Any] = {"model": "m", "messages": messages}
    if rng.random() < 0.3:
        body["tools"] = [{"type": "function", "function": {"name": "f", "description": "é"}}]
    if rng.random() < 0.2:
        body["messages"] = _random_value(rng)
    if rng.random() < 0.2:
        body["prompt"] = _random_value(rng)
    assert estimate_prompt_tokens(body) == estimate_before(body)


class _Message(Mapping[str, Any]):
    """A Mapping that is not a dict: prompt_bytes reads it as it reads a dict."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self._fields = fields

    def __getitem__(self, name: str) -> Any:
        return self._fields[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)


def test_prompt_bytes_reads_any_mapping_and_skips_the_rest() -> None:
    messages = [{"role": "user", "content": "a"}, "no", 3, None, ["x"], {"content": "b"}]
    as_dicts = prompt_bytes({"messages": messages})
    assert as_dicts == b"user\x1fa\x1e\x1fb"
    mapped = [_Message(m) if isinstance(m, dict) else m for m in messages]
    assert prompt_bytes({"messages": mapped}) == as_dicts
