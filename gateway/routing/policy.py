"""Choosing a replica for one request: a pure policy over the routing snapshot and what the
gateway holds in memory (its prefix index, breakers and the engines' last load samples). The
"prefix" policy's order of preference is gateway/routing/prefix_choice.py's; what a decision
holds, gateway/routing/decisions.py.

Replicas whose breaker is open are skipped unless every candidate's is. "least_load" and
"round_robin" are the baselines the routing benchmark compares against.

Nothing here does I/O or awaits: a decision costs microseconds (`bench/routing.py`
prints a timing), so it can sit on the hot path of every request. Scoring by KV events hashes
the prompt's blocks (gateway/routing/kv_blocks.py), no further than the longest match: measured
on the 2-core dev machine, 0.37 ms for a decision among 4 replicas where one holds 100 blocks
of 16 tokens, 34 us when none holds its first block (the hashing is the cost: 3.5 us a block).
Ranking the holders by the prediction of what they will still hold costs one prediction each:
on another 2-core VM (December 4), with full caches and a request waiting on each replica,
0.27 ms before and after for one holder of 100 blocks, 0.29 ms before and 0.32 ms after for
four.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence

from gateway.routing.breaker import CircuitBreaker
from gateway.routing.decisions import (
    POLICIES,
    Decision,
    OverloadMargin,
    Policy,
    PrefixOutbox,
    Reason,
    Sent,
)
from gateway.routing.kv_caches import KvCaches, KvMatch
from gateway.routing.loads import EngineLoadBoard
from gateway.routing.prefix_choice import PrefixChoice
from gateway.routing.prefix_index import Claims, PrefixIndex
from gateway.routing.request_key import RequestKey
from gateway.routing.slot_cache import SlotBoard
from gateway.routing.snapshot import RoutingSnapshot
from gateway.routing.token_load import DEFAULT_TOKENS_PER_S, TokenLoad
from gateway.routing.working_set import WorkingSets
from kv.index import KvBlockIndex
from workflows.contracts import ReplicaState, Route


class Router(PrefixChoice):
    """Owns the state a policy keeps between requests: the prefix index, the breakers and
    round-robin positions. The integrator feeds the breaker (`breaker.failed/succeeded`) and
    the load board (`loads.update(scrape_all(...))`), and calls `retain` when the routing table
    changes (gateway/engine_scrape.py does the last two)."""

    def __init__(
        self,
        policy: str = "prefix",
        *,
        index: PrefixIndex | None = None,
        breaker: CircuitBreaker | None = None,
        loads: EngineLoadBoard | None = None,
        margin: OverloadMargin | None = None,
        min_match_blocks: int = 2,
        clock: Callable[[], float] = time.monotonic,
        kv_index: KvBlockIndex | None = None,
        ttft_target_s: float = 0.0,
        prefill_tokens_per_s: float = DEFAULT_TOKENS_PER_S,
    ) -> None:
        """`min_match_blocks`: a shorter match is ignored, so a short boilerplate opening that
        many prompts share (one block is 256 bytes, ~64 tokens; an engine's block is its
        block_size tokens, 16 by vLLM's default) does not pull them all onto one replica.
        `kv_index`: what the engines report holding (gateway/kv/feeds.py fills it); without
        one, every replica is routed by the prefix index. `ttft_target_s`: under the "prefix"
        policy, a replica holding the prompt's prefix keeps it while its pending prefill would
        take at most this long at its measured rate (`prefill_tokens_per_s` until measured);
        0: while its request count is within `margin` (token_load.py)."""
        # A plain str, checked here: the name comes from settings or a command line.
        if policy not in POLICIES:
            raise ValueError(f"unknown routing policy {policy!r}; one of {', '.join(POLICIES)}")
        self.policy: Policy = policy
        self.index = index if index is not None else PrefixIndex()
        self.breaker = breaker if breaker is not None else CircuitBreaker()
        self.loads = loads if loads is not None else EngineLoadBoard()
        self.margin = margin if margin is not None else OverloadMargin()
        # Pending prefill tokens and measured prefill rate per replica (sticky until saturated).
        target = ttft_target_s if policy == "prefix" else 0.0
        self.tokens = TokenLoad(target, prefill_tokens_per_s, self.loads)
        self.min_match_blocks = max(1, min_match_blocks)
        # What the engines publishing KV events hold, and will hold when a request reaches them.
        self.kv = KvCaches(kv_index, self.loads)
        # What the slots of llama.cpp replicas that cache nothing else hold (slot_cache.py).
        self.slots = SlotBoard()
        # How much distinct prompt each replica was recently sent: where new prefixes go.
        self.working_sets = WorkingSets(self.min_match_blocks)
        self._clock = clock
        # Per model, where the next tie-break starts: kept here rather than in the snapshot so
        # a new routing table does not send the next burst of ties to the same replica.
        self._cursor: dict[str, int] = {}
        # Replicas with claims in the index, so `retain` scans the index only when one left.
        self._indexed: set[str] = set()
        # Told each prefix this gateway sends, for the other gateways (gateway/peers/).
        self.outbox: PrefixOutbox | None = None

    def choose(
        self,
        snapshot: RoutingSnapshot,
        request: RequestKey,
        inflight: Mapping[str, int],
        exclude: Collection[str] = (),
        now: float | None = None,
    ) -> Decision:
        """The replica for `request` among the model's READY replicas not in `exclude` (those
        this request already failed on). `inflight` is the gateway's own count per replica."""
        now = self._clock() if now is None else now
        ready = snapshot.ready(request.model)
        candidates = [r for r in ready if r.replica_id not in exclude] if exclude else ready
        if not candidates:
            return Decision(None, "none")
        breaker = self.breaker
        allowed = [r for r in candidates if breaker.allows(r.replica_id, now)]
        if not allowed:
            return self._all_ejected(candidates, now)

        ids = [r.replica_id for r in allowed]
        reason: Reason
        loads = [self._load(replica_id, inflight, now) for replica_id in ids]
        found: KvMatch | None = None
        predicted: int | None = None
        keys: Sequence[int] = ()
        uncached: int | None = None
        if self.policy == "round_robin":
            chosen, reason, matched = self._rotate(request.model, len(allowed)), "round_robin", 0
        elif self.policy == "least_load":
            chosen, reason, matched = self._least_loaded(request.model, loads), "least_load", 0
        else:
            given = request.prompt_keys
            keys = given if given is not None else self.index.hashes(request.prompt)
            chosen, reason, matched, found, predicted, uncached = self._by_prefix(
                request, keys, allowed, ids, loads, now
            )
        # A half-open replica lets one probe through: this request is it.
        breaker.started(ids[chosen], now)
        if predicted is None:
            predicted = 0 if found is None else self.kv.predicted(ids[chosen], found, now)
        kv_blocks = found.ids if found is not None else None
        return Decision(allowed[chosen], reason, matched, predicted, kv_blocks, keys, uncached)

    def succeeded(self, replica_id: str, now: float | None = None) -> None:
        """The replica answered (its response started): closes its breaker."""
        self.breaker.succeeded(replica_id, self._clock() if now is None else now)

    def failed(self, replica_id: str, now: float | None = None) -> None:
        """The replica failed before answering (refused, timed out, 502/503): counts towards
        ejecting it."""
        self.breaker.failed(replica_id, self._clock() if now is None else now)

    def retain(self, snapshot: RoutingSnapshot) -> None:
        """Forget replicas no longer READY in `snapshot`: a replica that restarted or left took
        its cache (and its failures) with it. Call it when the routing table changes, not per
        request: dropping a replica from the index scans the whole index."""
        routable = ReplicaState.routable()
        ready = {r.replica_id for r in snapshot.table.routes if r.state in routable}
        for replica_id in self._indexed - ready:
            self.index.forget(replica_id)
            self._indexed.discard(replica_id)
        for replica_id in self.breaker.known() - ready:
            self.breaker.forget(replica_id)
        self.kv.retain(ready)
        self.slots.retain(ready)
        self.working_sets.retain(ready)
        self.loads.retain(ready)
        self.tokens.retain(ready)

    def prompt_keys(self, prompt: bytes) -> Sequence[int] | None:
        """The prompt's block keys where the policy routes on them ("prefix"), for
        RequestKey.prompt_keys and `needs_no_tokens`: hashed once per request rather than at
        each step (measured: 180 us for the 64 KB the index reads of a long prompt). None under
        the other policies, which hash nothing to choose."""
        return self.index.hashes(prompt) if self.policy == "prefix" else None

    def needs_no_tokens(
        self,
        prompt: bytes,
        routes: Sequence[Route],
        now: float | None = None,
        keys: Sequence[int] | None = None,
    ) -> bool:
        """Whether a request's token ids could not change where it goes, so none need be asked
        of an engine: under the "prefix" policy, its routing prompt (RequestKey.prompt) starts
        a prefix this gateway never sent any of `routes` (it is placed by what each was sent
        lately, "new_prefix"), and in the last WorkingSets.window_s no engine of theirs held
        blocks while this gateway had sent it nothing lately (as after this gateway restarts)
        or while its gauges showed requests this gateway did not send (another gateway's, or a
        client's straight to the engine): those blocks might be the prefix. Another sender's
        requests that no metrics sample (one a second) caught go unseen: a gateway's first
        request of a prefix another one placed then misses its blocks. `keys`: the prompt's
        block keys, when already hashed (`prompt_keys`)."""
        if self.policy != "prefix":
            return False
        now = self._clock() if now is None else now
        if any(self._foreign_blocks(r.replica_id, now) for r in routes if r.kv is not None):
            return False
        if keys is None:
            keys = self.index.hashes(prompt)
        ids = [r.replica_id for r in routes]
        return self._starts_prefix(keys, self.index.longest_match_hashes(keys, ids))

    def _foreign_blocks(self, replica_id: str, now: float) -> bool:
        """Whether the replica's engine may hold blocks another sender left, in the last window
        (KvCaches.holds_foreign_blocks)."""
        sent_lately = self.working_sets.blocks(replica_id, now) > 0
        return self.kv.holds_foreign_blocks(
            replica_id, sent_lately, now, self.working_sets.window_s
        )

    def learn_prefix(self, replica_id: str, keys: Sequence[int], now: float) -> bool:
        """`replica_id` was sent the prompt of these block keys (by this gateway, or by another
        that said so: gateway/peers/). False where the index had it from less than REFRESH_S
        ago (prefix_index.py): then every gateway was told it within that time."""
        taken = self.index.insert_hashes(replica_id, keys, now)
        self._indexed.add(replica_id)
        self.working_sets.sent(replica_id, keys, now)
        return taken

    def learn_claims(self, claims: Claims, now: float) -> None:
        """Another gateway's record of what was sent where (its prefix index's claims, or a
        part of them: gateway/peers/), merged into this one's."""
        self.index.learn(claims, now)
        self._indexed.update(claims.replicas)

    def sent(
        self,
        route: Route,
        request: RequestKey,
        predicted_tokens: int,
        chosen_by: Decision | None = None,
        *,
        streamed: bool = True,
    ) -> Sent | None:
        """Note a request sent to `route`, for the choices and predictions of those sent after
        it: in its engine's eviction order where it publishes KV events (kv_pressure.py; with
        the request's token ids), in its slots where they are its cache (slot_cache.py). Its
        ticket for `started` and `finished`; None where neither applies. `chosen_by`: the
        decision that chose `route`, whose `kv_blocks` and `prompt_keys` are read on rather than
        hashed again. `streamed`: whether its first bytes will come back before it is done
        (`started` is then told)."""
        blocks_hashed = chosen_by.kv_blocks if chosen_by is not None else None
        now = self._clock()
        kv_ticket = self.kv.sent(
            route, request, predicted_tokens, blocks_hashed, now, streamed=streamed
        )
        uncached = chosen_by.uncached_tokens if chosen_by is not None else None
        pending = self.tokens.sent(route.replica_id, request, uncached, now)
        slot_ticket = None
        if route.prompt_slots is not None:
            keys = chosen_by.prompt_keys if chosen_by is not None else ()
            keys = keys or request.prompt_keys or self.index.hashes(request.prompt)
            slot_ticket = self.slots.sent(route.replica_id, route.prompt_slots, keys)
        if kv_ticket is None and slot_ticket is None and pending is None:
            return None
        return Sent(route.replica_id, kv_ticket, slot_ticket, pending)

    def tokens_arrived(
        self, sent: Sent, route: Route, request: RequestKey, token_ids: Sequence[int]
    ) -> None:
        """The token ids of a request sent without them (`RequestKey.tokens_later`) came: its
        place in its engine's eviction order gets its blocks, unless it has finished."""
        if sent.kv is not None:
            self.kv.tokens_arrived(route, sent.kv, request, token_ids)

    def started(self, sent: Sent | None) -> None:
        """Its first bytes came back: the engine has started it (and timed its prefill)."""
        if sent is None:
            return
        if sent.kv is not None:
            self.kv.started(sent.replica_id, sent.kv)
        if sent.tokens is not None:
            self.tokens.started(sent.tokens, self._clock())

    def finished(self, sent: Sent | None) -> None:
        """It ended: answered, failed or cancelled."""
        if sent is None:
            return
        if sent.kv is not None:
            self.kv.finished(sent.replica_id, sent.kv)
        if sent.slot is not None:
            self.slots.finished(sent.replica_id, sent.slot)
        if sent.tokens is not None:
            self.tokens.finished(sent.tokens)

    def _all_ejected(self, candidates: Sequence[Route], now: float) -> Decision:
        """Every candidate's breaker is open. Refusing would turn a blip that tripped every
        breaker at once (a network hiccup, a burst of 5xx under overload) into a full outage
        for up to a minute; the replica ejected longest ago is the likeliest to have recovered,
        so it gets the request, which then serves as an early probe."""
        oldest = self.breaker.ejected_longest_ago(r.replica_id for r in candidates)
        route = next((r for r in candidates if r.replica_id == oldest), candidates[0])
        self.breaker.started(route.replica_id, now)
        return Decision(route, "fallback_ejected")

    def _load(self, replica_id: str, inflight: Mapping[str, int], now: float) -> int:
        """This gateway's count now, plus the requests other gateways have there by the
        engine's last sample. Not the engine's figure alone: it is up to a scrape period old,
        and this gateway's requests in it may have finished since (loads.py)."""
        own = inflight.get(replica_id, 0)
        others = self.loads.others(replica_id, now)
        return own if others is None else own + others

    def _least_loaded(
        self, model: str, loads: Sequence[int], among: Collection[int] | None = None
    ) -> int:
        """Index of the least loaded (of `among`, when it names any); among equals, the first at
        or after the model's cursor."""
        count = len(loads)
        start = self._cursor.get(model, 0) % count
        best, best_load = -1, 0
        for offset in range(count):
            index = (start + offset) % count
            if among and index not in among:
                continue
            if best < 0 or loads[index] < best_load:
                best, best_load = index, loads[index]
        self._cursor[model] = best + 1
        return best

    def _rotate(self, model: str, count: int) -> int:
        index = self._cursor.get(model, 0) % count
        self._cursor[model] = index + 1
        return index
