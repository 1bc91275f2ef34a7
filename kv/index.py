"""Which replica holds which prefix-cache blocks, from the engines' own KV events (vLLM's
BlockStored, BlockRemoved, AllBlocksCleared; kv/events.py): the precise counterpart of
gateway/routing/prefix_index.py's record of what the gateway sent where. The node agent keeps
one for its replicas (the source of its KV feed, kv/feed.py), each gateway one for every
replica it routes to, filled from those feeds.

A request's blocks (kv/hashes.py, from its token ids) are looked up in order; a replica
scores the number of leading blocks it holds, since an engine reuses a prefix only up to its
first missing block. Pure, and bounded: each replica keeps at most `max_blocks` ids, the
oldest-stored dropped first (an engine evicts by its own LRU, so an old id is the likeliest to
be gone already; dropping it can only make the router underestimate a hit, never route to a
block that is not there). The bound is deterministic, so two indexes with the same bound fed the
same events in the same order hold the same blocks.

Memory: a block id is a 64-bit Python int in a dict, about 78 bytes with its slot (measured with
tracemalloc, 1,000,000 random ids stored 1,000 per event), so the default bound of 1,000,000
blocks per replica holds about 78 MB at most; 32-token blocks make that 32 million cached
tokens per replica. The storage medium of an event (GPU, CPU offload) is not told apart."""

from __future__ import annotations

from collections.abc import Iterable

from kv.events import AllBlocksCleared, BlockRemoved, BlockStored, Event, UnknownEvent

DEFAULT_MAX_BLOCKS = 1_000_000


class KvBlockIndex:
    def __init__(self, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        if max_blocks <= 0:
            raise ValueError(f"max_blocks must be positive, not {max_blocks}")
        self._max_blocks = max_blocks
        # replica id -> its block ids, oldest stored first (dicts keep insertion order).
        self._blocks: dict[str, dict[int, None]] = {}

    def apply(self, replica_id: str, event: Event) -> bool:
        """Apply one event from the replica's engine; False for an event this index cannot
        apply (UnknownEvent): the caller should then reset the replica rather than trust it."""
        if isinstance(event, BlockStored):
            self.store(replica_id, event.block_ids)
            return True
        if isinstance(event, BlockRemoved):
            self.remove(replica_id, event.block_ids)
            return True
        if isinstance(event, AllBlocksCleared):
            self.reset(replica_id)
            return True
        assert isinstance(event, UnknownEvent)
        return False

    def store(self, replica_id: str, block_ids: Iterable[int]) -> None:
        """The replica now holds these blocks (a BlockStored, or a KV feed's `stored` line)."""
        held = self._blocks.setdefault(replica_id, {})
        for block in block_ids:
            held.pop(block, None)  # stored again: now the newest
            held[block] = None
        while len(held) > self._max_blocks:
            del held[next(iter(held))]

    def remove(self, replica_id: str, block_ids: Iterable[int]) -> None:
        """The replica no longer holds these blocks."""
        holding = self._blocks.get(replica_id)
        if holding is None:
            return
        for block in block_ids:
            holding.pop(block, None)

    def reset(self, replica_id: str) -> None:
        """Forget what the replica holds: its engine restarted, a gap could not be replayed,
        or the replica is gone."""
        self._blocks.pop(replica_id, None)

    def size(self, replica_id: str) -> int:
        return len(self._blocks.get(replica_id, ()))

    def holds(self, replica_id: str, block: int) -> bool:
        return block in self._blocks.get(replica_id, ())

    def replicas(self) -> list[str]:
        """The replicas that hold at least one block."""
        return [replica_id for replica_id, held in self._blocks.items() if held]

    def blocks(self, replica_id: str) -> list[int]:
        """The replica's block ids, oldest stored first: the order that rebuilds this index's
        view of it in another (bounded the same way)."""
        return list(self._blocks.get(replica_id, ()))

    def leading_blocks(
        self, block_ids: Iterable[int], replica_ids: Iterable[str]
    ) -> dict[str, int]:
        """For each replica, how many of the request's first blocks it holds, in a row.

        `block_ids` is read once, and only as long as some replica still holds every block so
        far: a lazy iterable (engines/kv_hashes.iter_block_ids) is hashed no further than the
        longest match plus one block, and not at all when no replica holds anything."""
        scores = dict.fromkeys(replica_ids, 0)
        matching = [(r, held) for r in scores if (held := self._blocks.get(r))]
        if not matching:
            return scores
        for count, block in enumerate(block_ids, 1):
            matching = [(r, held) for r, held in matching if block in held]
            if not matching:
                break
            for replica_id, _ in matching:
                scores[replica_id] = count
        return scores
