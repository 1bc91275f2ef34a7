"""The caches of engines that publish KV events, as the router sees them: what each engine holds
of a request's leading blocks (the KV index, filled from the node agents' feeds by
gateway/kv/feeds.py), what it will still hold when it starts the request (the requests sent
ahead of it, kv_pressure.py), and the bookkeeping of each request sent there. The choice among
replicas stays in policy.py; this is what it reads and what it notes.

Pure and synchronous like the policy: no I/O, a clock passed in.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from itertools import islice

from gateway.routing.kv_blocks import BlockIds, request_block_ids
from gateway.routing.kv_pressure import KvPressure
from gateway.routing.loads import EngineLoadBoard
from gateway.routing.request_key import RequestKey
from kv.index import KvBlockIndex
from workflows.contracts import KvSource, Route

# A request's blocks noted for its engine's eviction order (kv_pressure.py): a longer prompt's
# later blocks are of unknown age there, which only makes them count as evicted earlier. Those
# the decision did not hash cost a hash each (about 3.5 us here): at most 0.45 ms a request.
KV_TRACKED_BLOCKS = 128


@dataclass(frozen=True, slots=True)
class KvMatch:
    """What one replica's engine holds of a request's leading blocks."""

    blocks: int  # leading blocks of the prompt the replica's engine holds
    block_size: int
    usable: int  # the most leading blocks the engine takes from its cache (see `matches`)
    ids: BlockIds  # the prompt's block ids as this replica's engine hashes them

    @property
    def tokens(self) -> int:
        """The held blocks' tokens: comparable across block sizes."""
        return self.blocks * self.block_size


class KvCaches:
    def __init__(self, index: KvBlockIndex | None, loads: EngineLoadBoard) -> None:
        """`index`: what the engines report holding; without one, nothing is matched and only
        the requests sent are noted. `loads`: the engines' last metrics samples, for each
        cache's size and whether requests wait there."""
        self.index = index
        self.loads = loads
        # What the engines will have evicted when a request sent now reaches them.
        self.pressure = KvPressure()
        # Replica -> until when its engine counts as holding blocks another sender left there.
        self._foreign_until: dict[str, float] = {}

    def matches(self, request: RequestKey, routes: Sequence[Route]) -> dict[str, KvMatch]:
        """What each of `routes` publishing KV events holds of the request's leading blocks;
        empty without token ids or such routes. Routes are grouped by how their engines hash
        (block size, seed and the adapter's path; normally one group per model), each group's
        blocks hashed lazily: no further than the longest match (kv_blocks.py states the
        cost)."""
        token_ids, index = request.token_ids, self.index
        if token_ids is None or index is None:
            return {}
        adapter = request.adapter
        groups: dict[tuple[int, str | None, str | None], tuple[KvSource, list[str]]] = {}
        for route in routes:
            if route.kv is not None:
                path = route.kv.adapters.get(adapter) if adapter is not None else None
                key = (route.kv.block_size, route.kv.hash_seed, path)
                groups.setdefault(key, (route.kv, []))[1].append(route.replica_id)
        found: dict[str, KvMatch] = {}
        for kv, replica_ids in groups.values():
            blocks = BlockIds(request_block_ids(token_ids, kv, request.cache_salt, adapter))
            # An engine recomputes at least the prompt's last token, so it takes at most the
            # full blocks before it from its cache (vLLM: max_cache_hit_length = tokens - 1).
            # Leading messages only: the prompt's last token comes after all of theirs.
            last = len(token_ids) if request.leading_only else len(token_ids) - 1
            usable = max(0, last // kv.block_size)
            for replica_id, count in index.leading_blocks(blocks, replica_ids).items():
                found[replica_id] = KvMatch(count, kv.block_size, usable, blocks)
        return found

    def predicted(self, replica_id: str, found: KvMatch, now: float) -> int:
        """The prompt tokens the replica's engine will take from its cache for this request:
        the leading blocks it reports holding, and after them those that requests sent there
        before this one will store, less those it will have evicted when it starts this one
        (kv_pressure.py), given its cache's size from its metrics."""
        pressure = self.pressure
        ahead = pressure.in_flight_run(replica_id, islice(found.ids, found.blocks, None))
        blocks = min(found.blocks + ahead, found.usable)
        if blocks == 0:
            return 0
        sample = self.loads.latest(replica_id, now)
        if sample is not None and sample.kv_blocks is not None and self.index is not None:
            blocks = pressure.surviving(
                replica_id,
                found.ids.first(blocks),
                sample.kv_blocks - 1,  # vLLM keeps one block aside (its null block)
                self.index,
                started_before=sample.taken_at if sample.waiting == 0 else None,
            )
        return blocks * found.block_size

    def sent(
        self,
        route: Route,
        request: RequestKey,
        predicted_tokens: int,
        hashed: BlockIds | None,
        now: float,
        *,
        streamed: bool,
    ) -> int | None:
        """Note a request sent to `route` in its engine's eviction order; its ticket, or None
        where the engine publishes no KV events or neither the request's token ids nor a
        promise of them (`RequestKey.tokens_later`) came with it. `hashed`: its block ids as
        the decision hashed them, read on rather than hashed again."""
        kv = route.kv
        if kv is None:
            return None
        if request.token_ids is None:
            if not request.tokens_later:
                return None
            # Its blocks, and what it needs, once its token ids come (tokens_arrived).
            return self.pressure.sent(route.replica_id, (), 0, now, streamed=streamed)
        ids: Iterable[int] = (
            hashed
            if hashed is not None
            else request_block_ids(request.token_ids, kv, request.cache_salt, request.adapter)
        )
        length = max(request.prompt_tokens, len(request.token_ids))
        need, full_blocks = _allocation(length, kv.block_size, predicted_tokens)
        return self.pressure.sent(
            route.replica_id,
            list(islice(ids, KV_TRACKED_BLOCKS)),
            need,
            now,
            full_blocks=full_blocks,
            streamed=streamed,
        )

    def tokens_arrived(
        self, route: Route, ticket: int, request: RequestKey, token_ids: Sequence[int]
    ) -> None:
        """The token ids of a request sent without them came: its place in its engine's
        eviction order gets its blocks, unless it has finished. Nothing was predicted cached
        for it: its prefix was new."""
        kv = route.kv
        if kv is None:
            return
        ids = request_block_ids(token_ids, kv, request.cache_salt, request.adapter)
        need, full_blocks = _allocation(len(token_ids), kv.block_size, 0)
        self.pressure.identify(
            route.replica_id,
            ticket,
            list(islice(ids, KV_TRACKED_BLOCKS)),
            need,
            full_blocks=full_blocks,
        )

    def started(self, replica_id: str, ticket: int) -> None:
        self.pressure.started(replica_id, ticket)

    def finished(self, replica_id: str, ticket: int) -> None:
        self.pressure.finished(replica_id, ticket)

    def holds_foreign_blocks(
        self, replica_id: str, sent_lately: bool, now: float, window_s: float
    ) -> bool:
        """Whether the replica's engine held blocks while this gateway could not tell it was
        their only sender, within the last `window_s`: this gateway had sent it nothing lately
        (`sent_lately` false, as after a restart), or the engine's last metrics sample showed
        requests this gateway did not send (another gateway's, or a client's straight to it).
        Sticky, so another sender's blocks are not forgotten as soon as this gateway sends the
        engine a request or a sample misses the other's."""
        until = self._foreign_until.get(replica_id)
        if until is not None and now < until:
            return True
        held = self.index is not None and self.index.size(replica_id) > 0
        if held and (not sent_lately or self.loads.others(replica_id, now)):
            self._foreign_until[replica_id] = now + window_s
            return True
        return False

    def retain(self, replica_ids: Collection[str]) -> None:
        """Forget the replicas not in `replica_ids` (they left the routing table)."""
        self.pressure.retain(replica_ids)
        for replica_id in self._foreign_until.keys() - set(replica_ids):
            del self._foreign_until[replica_id]


def _allocation(prompt_tokens: int, block_size: int, cached_tokens: int) -> tuple[int, int]:
    """(blocks an engine takes from its free queue when it starts a prompt of `prompt_tokens`
    with `cached_tokens` found cached, the prompt's full blocks). At its start an engine
    allocates the prompt's blocks and the first output token's."""
    need = -(-(prompt_tokens + 1) // block_size) - cached_tokens // block_size
    return need, prompt_tokens // block_size
