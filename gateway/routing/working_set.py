"""How much distinct prompt each replica was recently sent: where a new prefix has room.

A request whose prompt no replica holds starts a prefix there, and the requests sharing it
follow it (the prefix index routes them to it). Placed by load alone, the first requests of
new prefixes land wherever a request happened to finish first, so one replica can end up with
more prefixes than another: its cache evicts them where the other's had room, and it queues
more of their requests. A pinning that gives each replica its share of the prefixes avoids
both (bench/kv_routing.py's oracle), so the router places a new prefix where the least distinct
prompt was recently sent.

A replica's working set here is the sum, over the prefixes it was sent within the last
`window_s`, of the longest prompt of each, in the prefix index's 256-byte blocks. A prefix is a
prompt's first `root_blocks` blocks (the router's minimum match: a shorter prompt starts no
prefix worth a cache and is not counted). It is what this gateway sent, not what the engine
holds: an engine may have evicted a prefix still counted, or hold one another gateway sent.

Bounded: at most `max_prefixes` per replica (the oldest dropped first), each an int key and a
(float, int) pair in an OrderedDict, about 150 bytes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence

# How long a prefix counts after it was last sent. Not tuned: long enough to span the rounds of
# a workload whose prefixes come back (the KV benchmark's arms last under a minute), short
# enough that a prefix abandoned minutes ago no longer steers where new ones go.
DEFAULT_WINDOW_S = 120.0
DEFAULT_MAX_PREFIXES = 4096


class _Replica:
    __slots__ = ("blocks", "prefixes")

    def __init__(self) -> None:
        # First block key of the prefix -> (when last sent, its longest prompt in blocks); the
        # least recently sent first.
        self.prefixes: OrderedDict[int, tuple[float, int]] = OrderedDict()
        self.blocks = 0  # the sum of the prefixes' blocks


class WorkingSets:
    def __init__(
        self,
        root_blocks: int = 2,
        window_s: float = DEFAULT_WINDOW_S,
        max_prefixes: int = DEFAULT_MAX_PREFIXES,
    ) -> None:
        if root_blocks < 1 or window_s <= 0 or max_prefixes < 1:
            raise ValueError("root_blocks, window_s and max_prefixes must be positive")
        self.root_blocks = root_blocks
        self.window_s = window_s
        self.max_prefixes = max_prefixes
        self._replicas: dict[str, _Replica] = {}

    def starts_prefix(self, keys: Sequence[int]) -> bool:
        """Whether a prompt of these block keys is long enough to count."""
        return len(keys) >= self.root_blocks

    def sent(self, replica_id: str, keys: Sequence[int], now: float) -> None:
        """`replica_id` was sent the prompt these chained block keys describe (prefix_index)."""
        if not self.starts_prefix(keys):
            return
        replica = self._replicas.get(replica_id)
        if replica is None:
            replica = self._replicas[replica_id] = _Replica()
        root = keys[self.root_blocks - 1]
        old = replica.prefixes.pop(root, None)
        longest = len(keys) if old is None else max(old[1], len(keys))
        replica.blocks += longest - (0 if old is None else old[1])
        replica.prefixes[root] = (now, longest)
        self._expire(replica, now)
        while len(replica.prefixes) > self.max_prefixes:
            _, (_, blocks) = replica.prefixes.popitem(last=False)
            replica.blocks -= blocks

    def blocks(self, replica_id: str, now: float) -> int:
        """The replica's working set now, in blocks."""
        replica = self._replicas.get(replica_id)
        if replica is None:
            return 0
        self._expire(replica, now)
        return replica.blocks

    def entries(self, now: float) -> list[tuple[str, int, float, int]]:
        """Every prefix counted, as (replica, root key, seconds since last sent, blocks), the
        least recently sent first: what `learn` takes, in another process (gateway/peers/)."""
        return [
            (replica_id, root, now - when, blocks)
            for replica_id, replica in self._replicas.items()
            for root, (when, blocks) in replica.prefixes.items()
        ]

    def learn(self, entries: Sequence[tuple[str, int, float, int]], now: float) -> None:
        """Take what another process's `entries` gave: the later time and the longer prompt
        where both count a prefix."""
        for replica_id, root, age, blocks in entries:
            replica = self._replicas.get(replica_id)
            if replica is None:
                replica = self._replicas[replica_id] = _Replica()
            when = now - age
            old = replica.prefixes.pop(root, None)
            if old is not None:
                when, longest = max(when, old[0]), max(blocks, old[1])
                replica.blocks += longest - old[1]
            else:
                longest = blocks
                replica.blocks += blocks
            replica.prefixes[root] = (when, longest)
        for replica in self._replicas.values():
            self._expire(replica, now)
            while len(replica.prefixes) > self.max_prefixes:
                _, (_, dropped) = replica.prefixes.popitem(last=False)
                replica.blocks -= dropped

    def retain(self, replica_ids: Collection[str]) -> None:
        """Forget replicas not in `replica_ids` (their caches left with them)."""
        for replica_id in self._replicas.keys() - set(replica_ids):
            del self._replicas[replica_id]

    def _expire(self, replica: _Replica, now: float) -> None:
        prefixes, oldest = replica.prefixes, now - self.window_s
        while prefixes:
            root, (when, blocks) = next(iter(prefixes.items()))
            if when > oldest:
                break
            del prefixes[root]
            replica.blocks -= blocks
