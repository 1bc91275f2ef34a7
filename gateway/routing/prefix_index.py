"""Which replicas recently served a prompt's prefix: an approximate radix tree, per gateway.

llama.cpp, vLLM and SGLang keep the KV cache of recent prompts and skip the prefill of a prefix
they still hold, so a request sent to the replica that served the same long system prompt starts
sooner. The gateway cannot see the engines' caches, so it remembers what it sent where and
assumes recent prompts are still cached. That is approximate by design: a wrong guess costs one
cache miss, which is what any other choice would have cost.

The prompt's bytes are cut into fixed blocks, and each block's key hashes its parent's key with
the block's own bytes (chained the way vLLM chains its block hashes, but over bytes rather than
token ids and with another hash: these keys are not vLLM's and cannot be matched against its
KV-cache events), so one key stands for the whole prefix up to that block. A flat dict keyed
that way is a radix tree whose node ids are paths: matching a prompt is one dict lookup per
block, with no pointers to keep consistent.

Keys are secret-keyed, so a client cannot craft prompts that collide with another client's
prefix. Without a key (`hash_key=None`: tests, tools) they are Python's built-in `hash` of
(parent key, block bytes), SipHash keyed by a secret drawn when the process starts, so they mean
nothing outside the process. The gateway gives a key derived from the cluster's master secret
(workflows/engine_keys.py `prefix_hash_key`): every gateway process then computes the same keys,
so the prefixes one sends can be told to the others (gateway/peers/) and a restarted one can be
handed them. Those keys are BLAKE2b with that key over the prompt so far (one incremental hash,
finalised at each block boundary), 8 bytes. Measured on a shared 2-core VM for a 4 KB prompt
(16 blocks): about 3 us with the built-in hash, 9 to 10 us keyed; keyed, 64 KB (the 256-block
bound) takes about 130 us, of which BLAKE2b over the bytes is about 48 and the 256 digests'
finalisation most of the rest.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from array import array
from collections import OrderedDict, deque
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

# 256 bytes is about 64 tokens of English text at ~4 bytes a token (four of vLLM's default
# 16-token blocks). The index only has to rank replicas by how much of a prompt each holds, and
# blurring that by under 64 tokens of prefill changes few choices; what the block size does
# change is the hot path, which pays a hash, a lookup and an LRU touch per block. Measured on
# the 2-core CI box for a 4 KB prompt, a whole decision took ~25-35 µs with 256-byte blocks and
# ~40-60 µs with 128. Only full blocks count: a partial last block has no stable identity (the
# next request extends it), as in vLLM.
BLOCK_BYTES = 256

# A prompt indexes its first 256 blocks (64 KB, ~16k tokens) only, which bounds the work a huge
# prompt adds to the hot path; two prompts that share 64 KB share the engine cache worth having.
MAX_BLOCKS = 256

BYTES_PER_CLAIM = 400
DEFAULT_MAX_CLAIMS = 160_000

# The block keys of the last RECENT_PROMPTS prompts of at least RECENT_PROMPT_BYTES, kept with
# the prompt's bytes: an agent resends its whole context every turn, and once that is past 64 KB
# the bytes the index reads are the same every turn (as they are for every session behind one
# long system prompt and tools). They are found by the prompt's length and its first and last
# SAMPLE_BYTES, then one compare of the whole bytes: about 3.5 us for 64 KB, where Python's hash
# of all of it took 25 (perf: 2-3% of a 200 KB request's CPU) and the 256 keyed digests take 130
# to 230. Two prompts alike at both ends share a place and take it from each other, each then
# hashed afresh as if new. Only the bytes the keys cover are held, and the ends: at most
# RECENT_PROMPTS times 68 KB, 4.3 MB.
RECENT_PROMPTS = 64
RECENT_PROMPT_BYTES = 16 * 1024
SAMPLE_BYTES = 2048

# A prompt whose every block the replica already holds, its deepest sent there less than
# REFRESH_S ago, is not touched again: the refresh of a 64 KB prompt's 256 blocks (a new time
# and a move each) was 6-8% of a 200 KB request's CPU where an agent resends its context, and
# a second's difference in a last-use time changes no choice (it orders eviction, which starts
# from prompts unused for far longer, and ages shared with peers, which count in seconds).
# Holding the deepest block recently means holding all of them as recently: each insert times
# every block from the root down, so a block is never older than the blocks below it.
REFRESH_S = 1.0


@dataclass(frozen=True)
class Claims:
    """An index's claims as columns (PrefixIndex.claims): claim i is replica
    `replicas[holders[i]]` holding block `keys[i]`, last sent `ages_ms[i]` ago."""

    replicas: list[str]
    keys: array[int]
    holders: array[int]
    ages_ms: array[int]

    def encode(self) -> list[Any]:
        """For msgpack: the columns as little-endian bytes."""
        return [self.replicas, *(_little(column).tobytes() for column in self.columns)]

    @property
    def columns(self) -> tuple[array[int], array[int], array[int]]:
        return self.keys, self.holders, self.ages_ms

    def parts(self, size: int) -> Iterator[Claims]:
        """These claims `size` at a time, in order: for a caller that learns them in steps."""
        for start in range(0, len(self.keys), size):
            end = start + size
            yield Claims(
                self.replicas,
                self.keys[start:end],
                self.holders[start:end],
                self.ages_ms[start:end],
            )

    @classmethod
    def decode(cls, encoded: Sequence[Any]) -> Claims:
        """From `encode`'s form; ValueError when it is not that."""
        replicas, *raw = encoded
        if not isinstance(replicas, list) or len(raw) != 3:
            raise ValueError("not an index's claims")
        columns = []
        for code, data in zip(("q", "I", "I"), raw, strict=True):
            column = array(code)
            column.frombytes(data)
            columns.append(_little(column))
        keys, holders, ages = columns
        if not len(keys) == len(holders) == len(ages) or any(h >= len(replicas) for h in holders):
            raise ValueError("the claims' columns do not match")
        return cls([str(r) for r in replicas], keys, holders, ages)


def _little(column: array[int]) -> array[int]:
    """The column in little-endian order (a copy, on a big-endian machine)."""
    if sys.byteorder == "little":
        return column
    swapped = array(column.typecode, column)
    swapped.byteswap()
    return swapped


def block_hashes(
    prompt: bytes,
    block_bytes: int = BLOCK_BYTES,
    max_blocks: int = MAX_BLOCKS,
    hash_key: bytes | None = None,
) -> list[int]:
    """The chain key of each full block of `prompt`: key i covers bytes [0, (i+1)*block_bytes).
    With `hash_key`, the same on every process holding that key; without, this process's own."""
    count = min(len(prompt) // block_bytes, max_blocks)
    if not count:
        return []  # a prompt under a block, as many chats are: no hasher set up (0.7 us)
    end = count * block_bytes
    if hash_key is not None:
        # Most of the cost is per block rather than per byte (BLAKE2b alone over 64 KB is about
        # 48 of some 130 us), so a block costs a slice and two C calls: `digest` finalises a
        # copy of the state itself (the running hash goes on unchanged; a `copy()` first only
        # added a call), and the 8-byte digests become signed little-endian integers in one
        # unpack at the end rather than one int.from_bytes each.
        running = hashlib.blake2b(key=hash_key, digest_size=8)
        update, digest = running.update, running.digest
        digests: list[bytes] = []
        append_digest = digests.append
        for start in range(0, end, block_bytes):
            update(prompt[start : start + block_bytes])
            append_digest(digest())
        return list(struct.unpack(f"<{count}q", b"".join(digests)))
    keys: list[int] = []
    append = keys.append
    key = 0
    for start in range(0, end, block_bytes):
        key = hash((key, prompt[start : start + block_bytes]))
        append(key)
    return keys


def _drain(calls: Iterator[Any]) -> None:
    """Run a lazy map to its end in C (the standard library's `consume` recipe)."""
    deque(calls, maxlen=0)


class PrefixIndex:
    """Chain key -> {replica_id: last time it was sent that prefix}, least recently used first.

    The bound counts claims (replica, block) rather than nodes, so memory stays bounded however
    many replicas share a prefix. Eviction drops whole nodes, oldest first; `insert` touches a
    prompt's nodes deepest first, so a parent is always more recent than its children and the
    tree loses leaves before the prefixes they hang from.
    """

    def __init__(
        self,
        max_claims: int = DEFAULT_MAX_CLAIMS,
        block_bytes: int = BLOCK_BYTES,
        max_blocks: int = MAX_BLOCKS,
        hash_key: bytes | None = None,
    ) -> None:
        if max_claims < 1 or block_bytes < 1 or max_blocks < 1:
            raise ValueError("max_claims, block_bytes and max_blocks must be positive")
        self.max_claims = max_claims
        self.block_bytes = block_bytes
        self.max_blocks = max_blocks
        self.hash_key = hash_key
        self._nodes: OrderedDict[int, dict[str, float]] = OrderedDict()
        self._claims = 0
        # A prompt's length and ends -> the prompt and its keys, least recently used first
        # (RECENT_PROMPTS).
        self._recent: dict[tuple[int, bytes, bytes], tuple[bytes, tuple[int, ...]]] = {}

    def __len__(self) -> int:
        """Claims held: the quantity `max_claims` bounds."""
        return self._claims

    @property
    def node_count(self) -> int:
        return len(self._nodes)

    def hashes(self, prompt: bytes) -> Sequence[int]:
        """The prompt's block keys (`block_hashes`), a long prompt's from the recent ones when
        it was hashed lately."""
        if len(prompt) < RECENT_PROMPT_BYTES:
            return block_hashes(prompt, self.block_bytes, self.max_blocks, self.hash_key)
        # Only the bytes the keys cover are kept (a full slice is the prompt itself).
        read = prompt[: self.block_bytes * self.max_blocks]
        recent = self._recent
        ends = (len(read), read[:SAMPLE_BYTES], read[-SAMPLE_BYTES:])
        held = recent.pop(ends, None)
        if held is not None and held[0] == read:
            keys = held[1]
        else:
            keys = tuple(block_hashes(read, self.block_bytes, self.max_blocks, self.hash_key))
            if len(recent) >= RECENT_PROMPTS:
                del recent[next(iter(recent))]
        recent[ends] = (read, keys)
        return keys

    def insert(self, replica_id: str, prompt: bytes, now: float) -> bool:
        return self.insert_hashes(replica_id, self.hashes(prompt), now)

    def insert_hashes(self, replica_id: str, keys: Sequence[int], now: float) -> bool:
        """Record that `replica_id` was sent the prefix these chain keys describe; False where
        that was recorded less than REFRESH_S ago and nothing changed."""
        nodes = self._nodes
        get, move_to_end = nodes.get, nodes.move_to_end
        held = self._held(replica_id, keys)
        if held and held == len(keys) and 0.0 <= now - nodes[keys[-1]][replica_id] < REFRESH_S:
            return False
        added = 0
        # Deepest first, so every parent ends up more recent than its children. A block new to
        # the index is added at the end, which is its place when the blocks go deepest first:
        # only the blocks already there are moved (measured: a fresh 256-block prompt took about
        # a quarter less time than when every block was moved after the loop).
        for key in reversed(keys[held:]):
            node = get(key)
            if node is None:
                nodes[key] = {replica_id: now}
                added += 1
                continue
            if replica_id not in node:
                added += 1
            node[replica_id] = now
            move_to_end(key)
        if held:
            # Blocks the replica already holds only get a new time and move (no claim is added:
            # the binary search found the replica on every one). This is most of the blocks of
            # most requests (a shared system prompt). A plain loop, as Python 3.11 specialises
            # its item assignment: measured faster than a map over operator.setitem.
            shared = keys[:held] if held < len(keys) else keys
            for key in shared:
                nodes[key][replica_id] = now
            _drain(map(move_to_end, reversed(shared)))
        claims = self._claims + added
        while claims > self.max_claims:
            _, evicted = nodes.popitem(last=False)
            claims -= len(evicted)
        self._claims = claims
        return True

    def longest_match(self, prompt: bytes, candidates: Collection[str]) -> dict[str, int]:
        return self.longest_match_hashes(self.hashes(prompt), candidates)

    def longest_match_hashes(
        self, keys: Sequence[int], candidates: Collection[str]
    ) -> dict[str, int]:
        """For each candidate that holds the prompt's first block: how many leading blocks it
        holds. Candidates with no match are absent.

        The tree is prefix-closed per replica (a claim on a block implies claims on all blocks
        before it: they are inserted together and a parent is evicted after its children), so
        "holds block d" is monotone in d and a binary search finds the depth: a few lookups
        rather than one per block. Each round finds the deepest block any remaining candidate
        holds and credits those that hold it; the rest stop above it."""
        matched: dict[str, int] = {}
        nodes = self._nodes
        get = nodes.get
        first = get(keys[0]) if keys else None
        if first is None:
            return matched
        pending = [replica_id for replica_id in candidates if replica_id in first]
        high = len(keys)
        while pending:
            low = 1
            while low < high:
                mid = (low + high + 1) // 2
                node = get(keys[mid - 1])
                if node is not None and not node.keys().isdisjoint(pending):
                    low = mid
                else:
                    high = mid - 1
            deepest = nodes[keys[low - 1]]
            rest = []
            for replica_id in pending:
                if replica_id in deepest:
                    matched[replica_id] = low
                else:
                    rest.append(replica_id)
            pending, high = rest, low - 1
        return matched

    def last_used(self, replica_id: str, keys: Sequence[int]) -> float | None:
        """When `replica_id` was last sent the deepest of these blocks it holds (None: never)."""
        held = self._held(replica_id, keys)
        return self._nodes[keys[held - 1]][replica_id] if held else None

    def _held(self, replica_id: str, keys: Sequence[int]) -> int:
        """How many leading blocks `replica_id` holds (binary search; see longest_match)."""
        nodes = self._nodes
        low, high = 0, len(keys)
        while low < high:
            mid = (low + high + 1) // 2
            node = nodes.get(keys[mid - 1])
            if node is not None and replica_id in node:
                low = mid
            else:
                high = mid - 1
        return low

    def forget(self, replica_id: str) -> int:
        """Drop every claim of a replica that left (its engine's cache went with it); returns how
        many. A full scan: it runs when the routing table changes, never per request."""
        removed = 0
        empty: list[int] = []
        for key, node in self._nodes.items():
            if node.pop(replica_id, None) is not None:
                removed += 1
                if not node:
                    empty.append(key)
        for key in empty:
            del self._nodes[key]
        self._claims -= removed
        return removed

    def claims(self, now: float) -> Claims:
        """Every claim, least recently used node first: what `learn` takes, in another process
        (gateway/peers/)."""
        *_, found = self.claims_stepwise(now)
        assert found is not None
        return found

    def claims_stepwise(self, now: float, step: int = 10_000) -> Iterator[Claims | None]:
        """`claims`, yielding None after every `step` nodes so a caller on an event loop can let
        others run (a full index takes a few hundred milliseconds), then the claims. The nodes
        are the index's as it was when this began; a node changed meanwhile is read as it is
        when reached. Columns of machine integers rather than a tuple per claim: Python
        objects for 160,000 claims cost a second to build and as much to read back."""
        replicas: dict[str, int] = {}
        keys, holders, ages = array("q"), array("I"), array("I")
        for done, (key, node) in enumerate(list(self._nodes.items()), 1):
            for replica_id, at in node.items():
                keys.append(key)
                holders.append(replicas.setdefault(replica_id, len(replicas)))
                ages.append(min(max(int((now - at) * 1000), 0), 0xFFFFFFFF))
            if done % step == 0:
                yield None
        yield Claims(list(replicas), keys, holders, ages)

    def learn(self, claims: Claims, now: float) -> None:
        """Take `claims` as another index gave them (least recently used first), keeping the
        more recent time where both hold a claim; bounded as `insert_hashes` is."""
        nodes = self._nodes
        names = claims.replicas
        for key, holder, age_ms in zip(claims.keys, claims.holders, claims.ages_ms, strict=True):
            at = now - age_ms / 1000
            node = nodes.get(key)
            if node is None:
                node = nodes[key] = {}
            replica_id = names[holder]
            before = node.get(replica_id)
            if before is None:
                self._claims += 1
                node[replica_id] = at
            elif at > before:
                node[replica_id] = at
            nodes.move_to_end(key)
        while self._claims > self.max_claims:
            _, evicted = nodes.popitem(last=False)
            self._claims -= len(evicted)

    def replicas(self) -> set[str]:
        """Every replica with at least one claim (a full scan, for `forget` housekeeping)."""
        found: set[str] = set()
        for node in self._nodes.values():
            found.update(node)
        return found
