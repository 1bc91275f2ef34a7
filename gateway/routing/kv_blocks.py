"""A request's prefix-cache block ids as a vLLM replica computes them, from the prompt's token ids:
what the router looks up in the gateway's KvBlockIndex (engines/kv_index.py), filled from the
node agents' KV feeds (gateway/kv_feeds.py).

Everything that decides which ids a request gets is in `request_block_ids`, so matching a new
vLLM's keying is a change in one place. Pure: no I/O.

Cost, measured on this repository's dev machine (2 cores, CPython 3.11): 3.5 us per block of
16 tokens (sha256 over canonical CBOR), 0.35 ms for 100 blocks, about the same with a salt.
The router hashes lazily and stops at the first block no candidate holds
(KvBlockIndex.leading_blocks), so a prompt nobody has cached costs one block; a long prompt
that matches is hashed at most MAX_REQUEST_BLOCKS blocks deep (~3.6 ms at the bound).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from engines.kv_hashes import ExtraKeys, iter_block_ids
from workflows.contracts import KvSource

# How deep a prompt is hashed: 16,384 tokens with vLLM's default 16-token blocks. Replicas that
# both hold a longer prefix tie here, and the lighter one is chosen.
MAX_REQUEST_BLOCKS = 1024


def request_block_ids(
    token_ids: Sequence[int],
    kv: KvSource,
    cache_salt: str | None,
    max_blocks: int = MAX_REQUEST_BLOCKS,
) -> Iterator[int]:
    """The event ids of the request's full blocks on a replica described by `kv`, lazily, in
    order, at most `max_blocks` of them.

    The cache salt: vLLM (generate_block_hash_extra_keys) adds it to the extra keys of the
    block starting at token 0 only, after any LoRA and multimodal keys, tagged as
    `("cache_salt", salt)` (vLLM 0.32; up to 0.29 it was the bare string, which a LoRA name
    could collide with). Every later block has none and is still distinct, since it chains
    from the salted first. tests/e2e/test_vllm_cpu.py checks this against a real vLLM. The
    gateway asks for token ids only for requests without a LoRA adapter and with text
    prompts, so no LoRA or multimodal keys belong here. An empty salt is no salt, as in
    vLLM."""
    extra_keys: list[ExtraKeys] = [(("cache_salt", cache_salt),)] if cache_salt else []
    tokens = token_ids[: max_blocks * kv.block_size]
    return iter_block_ids(tokens, kv.block_size, kv.hash_seed, extra_keys)
