"""Issue 35's faster per-request steps on large bodies, each compared with the implementation it
replaced on random and adversarial inputs: the answers must be the very same."""

from __future__ import annotations

import random

import pytest

from gateway.body_parse import INLINE_BYTES_PER_VALUE, INLINE_SIZE_FACTOR, few_values

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
