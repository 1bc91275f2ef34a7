"""vLLM's prefix-cache block hashes, reproduced from token ids: the keys its KV-cache events
carry, so a router can tell which replica holds a request's leading blocks.

With `--prefix-caching-hash-algo sha256_cbor` (engines/vllm.py sets it), vLLM hashes each full
block of `block_size` tokens as

    H_i = sha256(CBOR_canonical([H_{i-1}, [token ids of block i], extra_keys or null]))

chained from NONE_HASH = sha256(CBOR_canonical(seed)): the seed is the engine's PYTHONHASHSEED
(engines/vllm.py sets "0" on every engine), or "vllm-none-hash" when it is unset (vLLM >= 0.29;
older versions then seed with random bytes nobody can reproduce). A partial last block is never
hashed. Events carry each 32-byte digest as its low 64 bits (`event_id`), but the chain goes on
from the full digest, so a router recomputes from the start of the prompt.

Extra keys change a block's hash for the same tokens (LoRA, multimodal, cache salt). They are
passed through as given here; gateway/routing/kv_blocks.py decides which a request gets, and
tests/e2e/test_vllm_cpu.py checks plain, chat and salted requests against a real vLLM 0.32.
Pure: no I/O, no engine."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence

import cbor2

# Block keys in vLLM's tuple form; cbor2 writes a tuple as an array.
ExtraKeys = tuple[object, ...] | None

UNSET_SEED = "vllm-none-hash"
DIGEST_BYTES = 32
_LOW_64 = (1 << 64) - 1


def sha256_cbor(value: object) -> bytes:
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


def none_hash(seed: str | None) -> bytes:
    """The parent of a prompt's first block: `seed` is the engine's PYTHONHASHSEED, None when
    it has none."""
    return sha256_cbor(UNSET_SEED if seed is None else seed)


def block_digests(
    token_ids: Sequence[int],
    block_size: int,
    seed: str | None,
    extra_keys: Sequence[ExtraKeys] = (),
) -> list[bytes]:
    """The 32-byte digest of each full block of `token_ids`, in order. `extra_keys[i]` (when
    given) is block i's extra keys; blocks past the end of it have none."""
    return list(iter_block_digests(token_ids, block_size, seed, extra_keys))


def iter_block_digests(
    token_ids: Sequence[int],
    block_size: int,
    seed: str | None,
    extra_keys: Sequence[ExtraKeys] = (),
) -> Iterator[bytes]:
    """`block_digests`, one block at a time: a caller that stops at the first block no replica
    holds hashes no further (each block costs a few microseconds)."""
    if block_size <= 0:
        raise ValueError(f"block size must be positive, not {block_size}")
    parent = none_hash(seed)
    for index in range(len(token_ids) // block_size):
        tokens = tuple(token_ids[index * block_size : (index + 1) * block_size])
        extra = extra_keys[index] if index < len(extra_keys) else None
        parent = sha256_cbor((parent, tokens, extra))
        yield parent


def event_id(digest: bytes) -> int:
    """A digest as vLLM's events carry it (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, the default
    since 0.10.2): its last 8 bytes, an unsigned 64-bit integer."""
    if len(digest) != DIGEST_BYTES:
        raise ValueError(f"a block digest is {DIGEST_BYTES} bytes, not {len(digest)}")
    return int.from_bytes(digest, "big") & _LOW_64


def block_ids(
    token_ids: Sequence[int],
    block_size: int,
    seed: str | None,
    extra_keys: Sequence[ExtraKeys] = (),
) -> list[int]:
    """The event ids of each full block of `token_ids`: what BlockStored reports for them."""
    return [event_id(d) for d in block_digests(token_ids, block_size, seed, extra_keys)]


def iter_block_ids(
    token_ids: Sequence[int],
    block_size: int,
    seed: str | None,
    extra_keys: Sequence[ExtraKeys] = (),
) -> Iterator[int]:
    """`block_ids`, one block at a time (see `iter_block_digests`)."""
    return (event_id(d) for d in iter_block_digests(token_ids, block_size, seed, extra_keys))
