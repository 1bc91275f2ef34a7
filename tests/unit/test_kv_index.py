"""The precise prefix index: what each replica's engine says it holds, scored by leading blocks."""

from collections.abc import Iterator

import pytest

from kv.events import AllBlocksCleared, BlockRemoved, BlockStored, UnknownEvent
from kv.hashes import block_ids
from kv.index import KvBlockIndex

PROMPT = list(range(1, 129))  # 4 blocks of 32
BLOCKS = block_ids(PROMPT, 32, "0")


def stored(ids: list[int]) -> BlockStored:
    return BlockStored(ids, None, [], 32)


def test_a_replica_scores_the_leading_blocks_it_holds_in_a_row() -> None:
    index = KvBlockIndex()
    index.apply("a", stored(BLOCKS[:3]))
    index.apply("b", stored([BLOCKS[0], BLOCKS[2], BLOCKS[3]]))  # block 1 missing: stops there
    assert index.leading_blocks(BLOCKS, ["a", "b", "c"]) == {"a": 3, "b": 1, "c": 0}


def test_removed_blocks_and_cleared_caches_stop_counting() -> None:
    index = KvBlockIndex()
    index.apply("a", stored(BLOCKS))
    index.apply("a", BlockRemoved([BLOCKS[1]]))
    assert index.leading_blocks(BLOCKS, ["a"]) == {"a": 1}
    index.apply("a", AllBlocksCleared())
    assert index.leading_blocks(BLOCKS, ["a"]) == {"a": 0}
    assert index.size("a") == 0


def test_an_unknown_event_is_not_applied_and_says_so() -> None:
    index = KvBlockIndex()
    index.apply("a", stored(BLOCKS))
    assert not index.apply("a", UnknownEvent("BlockMoved"))
    assert index.size("a") == 4  # the caller decides to reset


def test_each_replica_is_bounded_dropping_the_oldest_stored_first() -> None:
    index = KvBlockIndex(max_blocks=3)
    index.apply("a", stored(BLOCKS[:2]))
    index.apply("a", stored([BLOCKS[0]]))  # stored again: now the newest
    index.apply("a", stored(BLOCKS[2:4]))
    assert index.size("a") == 3
    # BLOCKS[1] was the oldest: gone, so the run of leading blocks stops after block 0.
    assert index.leading_blocks(BLOCKS, ["a"]) == {"a": 1}


def test_a_reset_replica_holds_nothing_and_others_are_untouched() -> None:
    index = KvBlockIndex()
    index.apply("a", stored(BLOCKS))
    index.apply("b", stored(BLOCKS))
    index.reset("a")
    assert index.leading_blocks(BLOCKS, ["a", "b"]) == {"a": 0, "b": 4}


def test_the_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        KvBlockIndex(max_blocks=0)


def test_leading_blocks_reads_a_lazy_request_no_further_than_the_longest_match() -> None:
    index = KvBlockIndex()
    index.apply("a", stored(BLOCKS[:2]))
    index.apply("b", stored(BLOCKS[:1]))
    read: list[int] = []

    def lazily() -> Iterator[int]:
        for block in BLOCKS:
            read.append(block)
            yield block

    assert index.leading_blocks(lazily(), ["a", "b", "c"]) == {"a": 2, "b": 1, "c": 0}
    assert read == BLOCKS[:3]  # the third block is where the last match ended
    read.clear()
    assert index.leading_blocks(lazily(), ["c"]) == {"c": 0}
    assert read == []  # a replica holding nothing costs no hashing


def test_store_and_remove_take_ids_directly() -> None:
    index = KvBlockIndex(max_blocks=3)
    index.store("a", [1, 2, 3])
    index.store("a", [1, 4])  # 1 becomes the newest; 2, the oldest, goes
    assert index.blocks("a") == [3, 1, 4]
    index.remove("a", [3, 99])
    index.remove("nobody", [1])
    assert index.blocks("a") == [1, 4]
    assert index.replicas() == ["a"]
