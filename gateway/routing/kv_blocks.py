"""A request's prefix-cache block ids as a vLLM replica computes them, from the prompt's token ids:
what the router looks up in the gateway's KvBlockIndex (kv/index.py), filled from the
node agents' KV feeds (gateway/kv/feeds.py).

Everything that decides which ids a request gets is in `request_block_ids`, so matching a new
vLLM's keying is a change in one place. Pure: no I/O.

Cost, measured on this repository's dev machine (2 cores, CPython 3.11): 3.5 us per block of
16 tokens (sha256 over canonical CBOR), 0.35 ms for 100 blocks, about the same with a salt.
The router hashes lazily and stops at the first block no candidate holds
(KvBlockIndex.leading_blocks), so a prompt nobody has cached costs one block; a long prompt
that matches is hashed at most MAX_REQUEST_BLOCKS blocks deep (~3.6 ms at the bound).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from kv.hashes import ExtraKeys, iter_block_ids
from workflows.contracts import KvSource

# How deep a prompt is hashed: 16,384 tokens with vLLM's default 16-token blocks. Replicas that
# both hold a longer prefix tie here, and the lighter one is chosen.
MAX_REQUEST_BLOCKS = 1024


def request_block_ids(
    token_ids: Sequence[int],
    kv: KvSource,
    cache_salt: str | None,
    adapter: str | None = None,
    max_blocks: int = MAX_REQUEST_BLOCKS,
) -> Iterator[int]:
    """The event ids of the request's full blocks on a replica described by `kv`, lazily, in
    order, at most `max_blocks` of them; none when the replica does not load `adapter`.

    Extra keys, as vLLM 0.32 makes them (generate_block_hash_extra_keys): a LoRA adapter's
    `("lora", name, path)` on every block, the path as the engine's --lora-modules gave it
    (`kv.adapters`); then, on the block starting at token 0 only, the cache salt as
    `("cache_salt", salt)` (up to vLLM 0.29 it was the bare string, which a LoRA name could
    collide with). Later blocks without an adapter have none and are still distinct, since
    they chain from the salted first. tests/e2e/test_vllm_cpu.py checks all of it against a
    real vLLM. The gateway asks for token ids only for text prompts, so no multimodal keys
    belong here. An empty salt is no salt, as in vLLM."""
    tokens = token_ids[: max_blocks * kv.block_size]
    lora: tuple[tuple[str, str, str], ...] = ()
    if adapter is not None:
        path = kv.adapters.get(adapter)
        if path is None:
            return iter(())
        lora = (("lora", adapter, path),)
    salt: tuple[tuple[str, str], ...] = (("cache_salt", cache_salt),) if cache_salt else ()
    extra_keys: list[ExtraKeys] = []
    if lora:
        extra_keys = [lora] * (len(tokens) // kv.block_size)
    if lora or salt:
        first: ExtraKeys = (*lora, *salt)
        extra_keys[:1] = [first]
    return iter_block_ids(tokens, kv.block_size, kv.hash_seed, extra_keys)


class BlockIds(Iterable[int]):
    """A request's block ids for one way of hashing (block size, seed, adapter, salt), hashed
    as far as a reader goes and kept: the router's match, its eviction estimate and its note of
    what was sent read the same ids, and each block is hashed once. Iterating again (or from
    several readers in turn) replays what is known, then hashes on."""

    __slots__ = ("_known", "_source")

    def __init__(self, ids: Iterator[int]) -> None:
        self._source = ids
        self._known: list[int] = []

    def __iter__(self) -> Iterator[int]:
        known = self._known
        position = 0
        while True:
            if position < len(known):
                yield known[position]
                position += 1
                continue
            block = next(self._source, None)
            if block is None:
                return
            known.append(block)

    def first(self, count: int) -> list[int]:
        """The first `count` block ids, or all of them if there are fewer."""
        if len(self._known) < count:
            for _ in zip(range(count), self, strict=False):
                pass
        return self._known[:count]
