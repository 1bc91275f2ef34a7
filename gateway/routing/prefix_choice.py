"""The "prefix" policy's choice of a replica (the Router in gateway/routing/policy.py mixes it
in).

The order of preference, for the "prefix" policy:
1. for replicas whose engines publish KV events (`Route.kv`), when the request carries its
   token ids: among those whose engines report holding at least two leading blocks of the
   prompt (KvBlockIndex, filled from the node agents' feeds by gateway/kv/feeds.py), the one
   whose engine will still hold the most when it starts the request (a full cache evicts
   before then; blocks a request sent ahead will store count: kv_caches.py reads both and
   notes each request sent, kv_pressure.py orders the evictions), then the one
   holding the most now; unless it is overloaded (then the next that is not, else the least
   loaded: "fallback_overloaded"). Overloaded: under a TTFT target, its pending prefill tokens
   and this request's pass what it prefills in that time, and the fallback is the least
   predicted wait with this request's own prefill, a holder included (token_load.py,
   docs/sticky-routing.md); with none, its count passes OverloadMargin;
2. else the replica holding the longest prefix of the prompt by the gateway's own record of
   what it sent where (prefix_index.py), or for a replica whose cache is its slots (llama.cpp
   with `--cache-ram 0`, `Route.prompt_slots`) by what the slot its engine would give the
   request holds (slot_cache.py), with the same overload rule;
3. with no match, the session's replica by rendezvous hashing, if the client named a session;
4. else, for a prompt of at least `min_match_blocks` blocks whose prefix this gateway never
   sent (it starts one that the requests sharing it will follow), the replica recently sent
   the least distinct prompt (working_set.py) among those not overloaded ("new_prefix"), ties
   to the least loaded; any other prompt to the least loaded, ties taken in turn. Either way,
   where some replicas' slot for the request holds the only copy of a prompt there, only the
   others not overloaded are considered.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from gateway.routing import affinity
from gateway.routing.decisions import OverloadMargin, PrefixOutbox, Reason
from gateway.routing.kv_caches import KvCaches, KvMatch
from gateway.routing.prefix_index import PrefixIndex
from gateway.routing.request_key import RequestKey
from gateway.routing.slot_cache import SlotBoard, SlotView
from gateway.routing.token_load import TOKENS_PER_INDEX_BLOCK, Judged, TokenLoad, prompt_tokens
from gateway.routing.working_set import WorkingSets
from workflows.contracts import Route


class PrefixChoice:
    """Mixed into Router, which provides what is declared here."""

    index: PrefixIndex
    margin: OverloadMargin
    tokens: TokenLoad
    min_match_blocks: int
    kv: KvCaches
    slots: SlotBoard
    working_sets: WorkingSets
    outbox: PrefixOutbox | None
    _cursor: dict[str, int]

    if TYPE_CHECKING:

        def _least_loaded(
            self, model: str, loads: Sequence[int], among: Collection[int] | None = None
        ) -> int: ...

        def learn_prefix(self, replica_id: str, keys: Sequence[int], now: float) -> bool: ...

    def _starts_prefix(self, keys: Sequence[int], matches: Mapping[str, int]) -> bool:
        """Whether the prompt of these block keys starts a prefix: long enough, and no replica
        was sent min_match_blocks of it (`matches`: longest_match_hashes)."""
        return self.working_sets.starts_prefix(keys) and all(
            n < self.min_match_blocks for n in matches.values()
        )

    def _by_prefix(
        self,
        request: RequestKey,
        keys: Sequence[int],
        routes: Sequence[Route],
        ids: Sequence[str],
        loads: Sequence[int],
        now: float,
    ) -> tuple[int, Reason, int, KvMatch | None, int | None, int | None]:
        """(index of the chosen replica, why, blocks it matched, what its engine reports
        holding of the prompt: None unless it publishes KV events, the cached tokens predicted
        there if the choice already worked them out, and under a TTFT target the prompt tokens
        it has to prefill)."""
        index = self.index
        least = min(loads)
        margin = self.margin
        chosen: int | None = None
        reason: Reason = "least_load"
        matched = 0
        new = False
        floor = self.min_match_blocks
        slots: dict[int, SlotView] = {}
        # Under a TTFT target, where a holder is to be judged: each candidate's pending tokens.
        judged: Judged | None = None
        sticky = self.tokens.enabled
        prompt = prompt_tokens(request) if sticky else 0

        kv = self.kv.matches(request, routes)
        # Most requests match nothing: no comprehension is run for them (about 0.4 us a choice).
        kv_usable = (
            [i for i, replica_id in enumerate(ids) if _blocks(kv, replica_id) >= floor]
            if kv
            else []
        )
        predicted: dict[int, int] = {}
        if kv_usable:
            # The most tokens the engine will still hold when it starts this request (a full
            # cache evicts before then, kv_pressure.py), then the most it holds now (replicas
            # may differ in block size); among equals the lighter.
            predicted = {i: self.kv.predicted(ids[i], kv[ids[i]], now) for i in kv_usable}
            kv_usable.sort(key=lambda i: (-predicted[i], -kv[ids[i]].tokens, loads[i]))
            if sticky:
                cached = [predicted.get(i, 0) for i in range(len(ids))]
                judged = self.tokens.judged(ids, prompt, cached, now)
            chosen = self._holder(request.model, kv_usable, loads, least, judged)
            reason = "kv_prefix" if chosen in kv_usable else "fallback_overloaded"
            matched = _blocks(kv, ids[chosen])
        else:
            # No engine reports enough of the prompt (or none publishes KV events): the
            # gateway's own record of what it sent where, then the session.
            matches = index.longest_match_hashes(keys, ids) if keys else {}
            new = self._starts_prefix(keys, matches)
            # Where the cache is the slots, what the slot the engine would give this request
            # holds of it, rather than what was sent there (slot_cache.py).
            slots = self._slot_views(routes, keys)
            for i, view in slots.items():
                matches[ids[i]] = view.found
            usable = (
                [i for i, replica_id in enumerate(ids) if matches.get(replica_id, 0) >= floor]
                if matches
                else []
            )
            if usable:
                # Longest match first; among equal matches the lighter replica.
                usable.sort(key=lambda i: (-matches[ids[i]], loads[i]))
                if sticky:
                    cached = [matches.get(r, 0) * TOKENS_PER_INDEX_BLOCK for r in ids]
                    judged = self.tokens.judged(ids, prompt, cached, now)
                chosen = self._holder(request.model, usable, loads, least, judged)
                reason = "prefix" if chosen in usable else "fallback_overloaded"
                matched = matches.get(ids[chosen], 0)
            elif request.session:
                owner = affinity.owner(request.session, ids)
                if owner is not None and not margin.exceeded(loads[owner], least):
                    chosen, reason = owner, "session"
                else:
                    chosen = self._least_loaded(request.model, loads)
                    reason = "fallback_overloaded"
        if chosen is None and new:
            chosen, reason = self._place(request.model, ids, loads, least, slots, now), "new_prefix"
        elif chosen is None:
            chosen = self._least_loaded(request.model, loads, self._spares(slots, loads, least))

        if keys:
            # Whatever the reason, the chosen engine will now cache this prompt: a hot prefix
            # that overflowed onto a second replica is then matched on both. Kept for replicas
            # with KV events too: it routes them while their feed is down.
            taken = self.learn_prefix(ids[chosen], keys, now)
            # Told to the other gateways only where the index took it: a prompt resent within
            # REFRESH_S was told them when it was taken (a resent 200 KB context's 256 keys,
            # listed, packed and signed for every request, were about 2% of its CPU).
            if taken and self.outbox is not None:
                self.outbox.prefix_sent(ids[chosen], keys)
        uncached = judged.uncached(chosen) if judged is not None else prompt if sticky else None
        return chosen, reason, matched, kv.get(ids[chosen]), predicted.get(chosen), uncached

    def _holder(
        self,
        model: str,
        order: Sequence[int],
        loads: Sequence[int],
        least: int,
        judged: Judged | None,
    ) -> int:
        """The first holder in `order` not overloaded; else, by `judged`, the least predicted
        wait (a holder, or not), by OverloadMargin the least loaded (never a holder)."""
        if judged is None:
            found = next((i for i in order if not self.margin.exceeded(loads[i], least)), None)
            return self._least_loaded(model, loads) if found is None else found
        found = judged.first_within(order)
        if found is None:
            found = judged.quickest(loads, self._cursor.get(model, 0))
            self._cursor[model] = found + 1
        return found

    def _slot_views(self, routes: Sequence[Route], keys: Sequence[int]) -> dict[int, SlotView]:
        """For each candidate whose cache is its slots, what this request would meet there."""
        return {
            i: self.slots.view(route.replica_id, route.prompt_slots, keys)
            for i, route in enumerate(routes)
            if route.prompt_slots is not None
        }

    def _place(
        self,
        model: str,
        ids: Sequence[str],
        loads: Sequence[int],
        least: int,
        slots: Mapping[int, SlotView],
        now: float,
    ) -> int:
        """Index of the replica for a prompt whose prefix this gateway never sent (and no
        session places). It starts a prefix that the requests sharing it will follow, so it
        goes where the least distinct prompt was recently sent (working_set.py), among the
        replicas that are not overloaded and where it evicts no prompt's only slot (_spares);
        among equals the least loaded."""
        among = self._spares(slots, loads, least) or [
            i for i in range(len(loads)) if not self.margin.exceeded(loads[i], least)
        ]
        sizes = {i: self.working_sets.blocks(ids[i], now) for i in among}
        smallest = min(sizes.values())
        return self._least_loaded(model, loads, [i for i, n in sizes.items() if n == smallest])

    def _spares(self, slots: Mapping[int, SlotView], loads: Sequence[int], least: int) -> list[int]:
        """Where a request that matches nothing evicts nothing another request will want: every
        candidate but those whose slot for it holds the only copy of a prompt there, and those
        overloaded. Empty (any candidate) when every one would evict or no cache is slots."""
        if not slots or not any(view.evicts for view in slots.values()):
            return []
        return [
            i
            for i in range(len(loads))
            if not (i in slots and slots[i].evicts) and not self.margin.exceeded(loads[i], least)
        ]


def _blocks(kv: Mapping[str, KvMatch], replica_id: str) -> int:
    found = kv.get(replica_id)
    return found.blocks if found is not None else 0
