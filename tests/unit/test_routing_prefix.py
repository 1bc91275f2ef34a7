"""The prefix index: which replica recently served a prompt's leading blocks."""

from __future__ import annotations

import hashlib
import os
import random
import tracemalloc
from collections.abc import Sequence

import pytest

from gateway.routing.prefix_index import (
    BLOCK_BYTES,
    BYTES_PER_CLAIM,
    MAX_BLOCKS,
    RECENT_PROMPT_BYTES,
    RECENT_PROMPTS,
    REFRESH_S,
    SAMPLE_BYTES,
    PrefixIndex,
    block_hashes,
)

SYSTEM_A = b"You are a careful assistant for the billing team. " * 30  # ~1.5 KB
SYSTEM_B = b"You translate legal documents from French to English. " * 30


def blocks(prompt: bytes) -> int:
    return len(prompt) // BLOCK_BYTES


def test_only_full_blocks_count_and_each_key_covers_its_whole_prefix() -> None:
    assert block_hashes(b"x" * (BLOCK_BYTES - 1)) == []
    one, two = block_hashes(b"a" * BLOCK_BYTES * 2 + b"tail")
    # Same bytes at a different depth: a different key, because the key chains its parent.
    assert one != two
    shared = SYSTEM_A[: BLOCK_BYTES * 3]
    first = block_hashes(shared + b"first question" * 20)
    second = block_hashes(shared + b"other question" * 20)
    assert first[:3] == second[:3]
    assert first[3] != second[3]


def test_a_huge_prompt_indexes_only_its_first_blocks() -> None:
    assert len(block_hashes(b"z" * BLOCK_BYTES * 10, max_blocks=4)) == 4


def keyed_reference(prompt: bytes, block_bytes: int, max_blocks: int, key: bytes) -> list[int]:
    """Each block's key from its definition: the keyed BLAKE2b of the whole prompt up to the
    block's end, hashed afresh (no incremental state), as a signed little-endian integer."""
    count = min(len(prompt) // block_bytes, max_blocks)
    return [
        int.from_bytes(
            hashlib.blake2b(prompt[:end], key=key, digest_size=8).digest(), "little", signed=True
        )
        for end in range(block_bytes, count * block_bytes + 1, block_bytes)
    ]


def test_keyed_block_hashes_are_the_keyed_blake2b_of_each_prefix() -> None:
    # Gateway processes exchange these keys (gateway/peers/), so a faster way to compute them
    # must give the very same values: prompts shorter than a block, not a multiple of it, and
    # past the 64 KB bound, under keys of several lengths and other block sizes.
    rng = random.Random(35)
    sizes = [0, 1, BLOCK_BYTES - 1, BLOCK_BYTES, BLOCK_BYTES + 1, 4000, 65_536, 70_001, 200_000]
    for size in sizes:
        prompt = rng.randbytes(size)
        key = rng.randbytes(rng.choice((1, 16, 32, 64)))
        assert block_hashes(prompt, hash_key=key) == keyed_reference(prompt, BLOCK_BYTES, 256, key)
    for _ in range(20):
        prompt = rng.randbytes(rng.randrange(0, 3000))
        block_bytes, max_blocks = rng.randrange(1, 300), rng.randrange(1, 40)
        key = rng.randbytes(rng.randrange(1, 65))
        assert block_hashes(prompt, block_bytes, max_blocks, key) == keyed_reference(
            prompt, block_bytes, max_blocks, key
        )


def test_keyed_block_hashes_match_the_values_other_gateways_compute() -> None:
    # Values an earlier release computed: a change here splits a cluster's prefix picture.
    prompt = b"The quick brown fox. " * 40
    assert block_hashes(prompt, hash_key=b"k" * 32) == [
        283370072304628047,
        6100497097879994437,
        -369256098478616230,
    ]


@pytest.mark.parametrize("hash_key", [None, b"k" * 32])
def test_a_long_prompt_sent_again_gets_the_keys_it_hashed_to(hash_key: bytes | None) -> None:
    """An agent's context resent each turn: its keys come from the recent prompts, and are the
    keys it hashes to, whatever object holds the bytes, for prompts past the bound too."""
    index = PrefixIndex(hash_key=hash_key)
    rng = random.Random(7)
    sizes = [RECENT_PROMPT_BYTES - 1, RECENT_PROMPT_BYTES, 70 * 1024, 300 * 1024]
    prompts = [bytes(rng.getrandbits(8) for _ in range(size)) for size in sizes]
    for _ in range(2):
        for prompt in prompts:
            again = bytes(bytearray(prompt))  # equal bytes, another object
            assert list(index.hashes(again)) == block_hashes(prompt, hash_key=hash_key)
    # The same 64 KB read, whatever follows it: one entry, the same keys.
    longer = prompts[3] + b"more"
    assert list(index.hashes(longer)) == block_hashes(longer, hash_key=hash_key)
    assert len(index._recent) == 3  # the three prompts of at least RECENT_PROMPT_BYTES


def test_the_recent_prompts_are_bounded_and_hold_only_what_the_keys_cover() -> None:
    index = PrefixIndex()
    for n in range(RECENT_PROMPTS * 2):
        index.hashes(n.to_bytes(4, "big") * (MAX_BLOCKS * BLOCK_BYTES))  # 256 KB each
    assert len(index._recent) == RECENT_PROMPTS
    held = dict(index._recent.values())
    assert all(len(prompt) == MAX_BLOCKS * BLOCK_BYTES for prompt in held)
    # The least recently used went first: the earliest are gone, the latest are there.
    first, last = (
        n.to_bytes(4, "big") * (MAX_BLOCKS * BLOCK_BYTES // 4) for n in (0, RECENT_PROMPTS * 2 - 1)
    )
    assert first not in held, "the oldest prompt was kept"
    assert last in held, "the latest prompt was not kept"
    assert held[last] == tuple(block_hashes(last))


def test_prompts_alike_at_both_ends_each_get_their_own_keys() -> None:
    # Found by their length and ends first: two prompts that differ only in the middle share a
    # place, and each turn must still give each its own keys, whichever held the place last.
    index = PrefixIndex()
    ends = b"e" * (SAMPLE_BYTES + BLOCK_BYTES)
    one, other = (ends + middle * RECENT_PROMPT_BYTES + ends for middle in (b"1", b"2"))
    for _ in range(3):
        for prompt in (one, other, other, one):
            assert list(index.hashes(bytes(bytearray(prompt)))) == block_hashes(prompt)
    assert len(index._recent) == 1


def test_longest_match_picks_the_replica_that_served_the_shared_system_prompt() -> None:
    index = PrefixIndex()
    index.insert("r-a", SYSTEM_A + b"How do refunds work?", now=1.0)
    index.insert("r-b", SYSTEM_B + b"Bonjour, le contrat...", now=2.0)
    matches = index.longest_match(SYSTEM_A + b"Why was I charged twice?", ["r-a", "r-b", "r-c"])
    assert matches == {"r-a": blocks(SYSTEM_A)}


def test_each_candidate_gets_its_own_depth_and_others_are_left_out() -> None:
    index = PrefixIndex()
    long_prompt = SYSTEM_A + SYSTEM_B
    index.insert("deep", long_prompt, now=1.0)
    index.insert("shallow", SYSTEM_A[: BLOCK_BYTES * 2] + b"!" * 500, now=2.0)
    index.insert("elsewhere", SYSTEM_B, now=3.0)
    matches = index.longest_match(long_prompt, ["deep", "shallow", "elsewhere"])
    assert matches == {"deep": blocks(long_prompt), "shallow": 2}
    # A replica that is not a candidate (ejected, or already tried) is not reported.
    assert index.longest_match(long_prompt, ["shallow"]) == {"shallow": 2}
    assert index.longest_match(b"nothing like it" * 50, ["deep", "shallow"]) == {}


def test_last_use_times_follow_the_latest_insert() -> None:
    index = PrefixIndex()
    keys = index.hashes(SYSTEM_A)
    assert index.last_used("r-a", keys) is None
    index.insert("r-a", SYSTEM_A, now=5.0)
    index.insert("r-a", SYSTEM_A + b"more" * 100, now=9.0)
    assert index.last_used("r-a", keys) == 9.0


def test_a_prompt_resent_within_the_refresh_interval_keeps_its_time_and_place() -> None:
    # An agent resending its context: the second send within REFRESH_S changes nothing, a send
    # after it refreshes every block, and a longer prompt refreshes at once.
    index = PrefixIndex()
    keys = index.hashes(SYSTEM_A)
    index.insert("r-a", SYSTEM_A, now=100.0)
    index.insert("r-b", SYSTEM_B, now=100.2)
    index.insert("r-a", SYSTEM_A, now=100.0 + REFRESH_S / 2)
    assert index.last_used("r-a", keys) == 100.0
    oldest_first = list(index.claims(101.0).replicas)
    assert oldest_first[0] == "r-a"  # not moved behind r-b's prompt
    index.insert("r-a", SYSTEM_A, now=100.0 + REFRESH_S)
    assert index.last_used("r-a", keys) == 100.0 + REFRESH_S
    longer = SYSTEM_A + b"and the next turn " * 20
    index.insert("r-a", longer, now=100.1 + REFRESH_S)
    assert index.last_used("r-a", keys) == 100.1 + REFRESH_S
    assert index.last_used("r-a", index.hashes(longer)) == 100.1 + REFRESH_S
    # Another replica sent the same prompt is a claim of its own, refreshed or not.
    index.insert("r-b", SYSTEM_A, now=100.2 + REFRESH_S)
    assert index.longest_match(SYSTEM_A, ["r-a", "r-b"]) == {
        "r-a": blocks(SYSTEM_A),
        "r-b": blocks(SYSTEM_A),
    }


def test_eviction_keeps_memory_bounded_under_a_flood_of_distinct_prompts() -> None:
    index = PrefixIndex(max_claims=500)
    for n in range(5_000):
        # A shared system prompt then a unique question, as most traffic looks.
        index.insert("r-a", SYSTEM_A + os.urandom(BLOCK_BYTES * 3), now=float(n))
        assert len(index) <= 500
    assert index.node_count <= 500
    # The shared prefix is touched by every request, so it outlives the unique tails.
    assert index.longest_match(SYSTEM_A, ["r-a"]) == {"r-a": blocks(SYSTEM_A)}
    latest = SYSTEM_A + b"latest" * 100
    index.insert("r-a", latest, now=9e9)
    assert index.longest_match(latest, ["r-a"]) == {"r-a": blocks(latest)}


def test_the_documented_cost_per_claim_holds() -> None:
    claims = 20_000
    index = PrefixIndex(max_claims=claims)
    # One-block prompts, one replica each: the worst case per claim.
    prompts = [os.urandom(BLOCK_BYTES) for _ in range(claims * 2)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n, prompt in enumerate(prompts):
            index.insert("r-a", prompt, now=float(n))
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(index) == claims
    assert used <= claims * BYTES_PER_CLAIM


def test_a_replica_shared_by_many_still_counts_every_claim() -> None:
    index = PrefixIndex(max_claims=40)
    for replica in range(8):
        index.insert(f"r-{replica}", SYSTEM_A[: BLOCK_BYTES * 4], now=float(replica))
    assert len(index) <= 40
    assert index.node_count <= 4


def test_forget_drops_a_departed_replica_and_keeps_the_rest() -> None:
    index = PrefixIndex()
    index.insert("gone", SYSTEM_A, now=1.0)
    index.insert("stays", SYSTEM_A, now=2.0)
    index.insert("gone", SYSTEM_B, now=3.0)
    assert index.forget("gone") == blocks(SYSTEM_A) + blocks(SYSTEM_B)
    assert index.longest_match(SYSTEM_A, ["gone", "stays"]) == {"stays": blocks(SYSTEM_A)}
    assert index.longest_match(SYSTEM_B, ["gone", "stays"]) == {}
    assert len(index) == blocks(SYSTEM_A) == index.node_count
    assert index.replicas() == {"stays"}


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="block_bytes and max_blocks must be positive"):
        PrefixIndex(max_claims=0)


class PlainInsert(PrefixIndex):
    """`insert_hashes` written the plain way: nothing where every block is held and the deepest
    was sent within REFRESH_S; else times set, claims counted, then every block moved to the end
    deepest first, then the oldest nodes evicted. False where it did nothing."""

    def insert_hashes(self, replica_id: str, keys: Sequence[int], now: float) -> bool:
        held = self._held(replica_id, keys)
        all_held = bool(keys) and held == len(keys)
        if all_held and now - self._nodes[keys[-1]][replica_id] < REFRESH_S:
            return False
        for key in keys[:held]:
            self._nodes[key][replica_id] = now
        for key in keys[held:]:
            node = self._nodes.setdefault(key, {})
            if replica_id not in node:
                self._claims += 1
            node[replica_id] = now
        for key in reversed(keys):
            self._nodes.move_to_end(key)
        while self._claims > self.max_claims:
            _, evicted = self._nodes.popitem(last=False)
            self._claims -= len(evicted)
        return True


def state(index: PrefixIndex, now: float) -> tuple[object, ...]:
    """Everything an index shows: its claims in order, with their holders and times."""
    claims = index.claims(now)
    return (len(index), index.node_count, claims.replicas, *map(list, claims.columns))


def test_insert_leaves_the_index_as_the_plain_algorithm_does() -> None:
    # Prompts that share prefixes (a small alphabet, 4-byte blocks), half of them resent soon
    # after (within REFRESH_S or not), replicas that share them, an index small enough to
    # evict, and now and then a replica forgotten or another index's claims learned part by
    # part (which leaves a replica holding blocks without their parents until the last part):
    # the order of the nodes, their claims and times must all agree.
    rng = random.Random(2)
    fast, plain, other = (
        kind(300, block_bytes=4, max_blocks=40) for kind in (PrefixIndex, PlainInsert, PrefixIndex)
    )
    replicas = ["r-a", "r-b", "r-c", "r-d"]
    sent: list[bytes] = []
    for step in range(1500):
        now = step * REFRESH_S / 3  # a prompt resent within REFRESH_S now and then
        action = rng.random()
        if action < 0.03:
            gone = rng.choice(replicas)
            assert fast.forget(gone) == plain.forget(gone)
        elif action < 0.06:
            for part in other.claims(now).parts(37):
                fast.learn(part, now)
                plain.learn(part, now)
        else:
            prompt = bytes(rng.choice(b"ab") for _ in range(rng.randrange(0, 170)))
            if sent and rng.random() < 0.5:
                prompt = rng.choice(sent[-4:])  # resent, as an agent resends its context
            sent.append(prompt)
            replica = rng.choice(replicas)
            target = other if action < 0.2 else None
            if target is not None:
                target.insert(replica, prompt, now)
                continue
            assert fast.insert(replica, prompt, now) == plain.insert(replica, prompt, now)
            assert fast.longest_match(prompt, replicas) == plain.longest_match(prompt, replicas)
        assert state(fast, now) == state(plain, now)
    assert len(fast) == 300  # the bound was reached, so eviction was compared too
