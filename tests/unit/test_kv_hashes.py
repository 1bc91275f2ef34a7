"""vLLM's prefix-cache block hashes reproduced from token ids, against the golden values read
from a real vLLM's events (tokens 1..32, block size 16, no extra keys)."""

import pytest

from kv.hashes import block_digests, block_ids, event_id, none_hash

TOKENS = list(range(1, 33))


def test_the_golden_values_with_pythonhashseed_0() -> None:
    assert block_ids(TOKENS, 16, "0") == [3236607068019569386, 2758186210834249151]


def test_the_golden_values_without_pythonhashseed() -> None:
    assert block_ids(TOKENS, 16, None) == [8866452693264111234, 807986237951177663]


def test_a_partial_last_block_has_no_hash() -> None:
    assert block_ids(TOKENS[:31], 16, "0") == block_ids(TOKENS, 16, "0")[:1]
    assert block_ids(TOKENS[:15], 16, "0") == []


def test_each_block_chains_from_the_full_digest_of_the_one_before() -> None:
    # The same second block after a different first one hashes differently: the chain, not the
    # tokens alone, names a block.
    other_first = [100 + t for t in TOKENS[:16]] + TOKENS[16:]
    assert block_ids(other_first, 16, "0")[1] != block_ids(TOKENS, 16, "0")[1]
    digests = block_digests(TOKENS, 16, "0")
    assert [event_id(d) for d in digests] == block_ids(TOKENS, 16, "0")
    assert all(len(d) == 32 for d in digests)


def test_the_seed_and_extra_keys_change_every_hash() -> None:
    plain = block_ids(TOKENS, 16, "0")
    assert block_ids(TOKENS, 16, "1") != plain
    salted = block_ids(TOKENS, 16, "0", [("cache_salt", "tenant-a")])
    assert salted[0] != plain[0]
    assert salted[1] != plain[1]  # chained from a different parent
    assert none_hash("0") != none_hash(None)


def test_event_ids_are_unsigned_64_bit() -> None:
    assert event_id(b"\xff" * 32) == 2**64 - 1
    with pytest.raises(ValueError, match="32 bytes"):
        event_id(b"\x00" * 8)
    with pytest.raises(ValueError, match="positive"):
        block_ids(TOKENS, 0, "0")
