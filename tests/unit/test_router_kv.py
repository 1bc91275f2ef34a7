"""The "prefix" policy on replicas that publish KV events: scored by the leading blocks their
engines report holding (KvBlockIndex), with the approximate index and sessions as before when
nothing matches, and unchanged for replicas without KV events."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from gateway.routing import Decision, OverloadMargin, RequestKey, Router, RoutingSnapshot
from gateway.routing.kv_blocks import BlockIds, request_block_ids
from gateway.routing.loads import LoadSample
from kv.hashes import block_ids
from kv.index import KvBlockIndex
from workflows.contracts import KvSource, ReplicaState, Route, RoutingTable

BLOCK = 4
KV = KvSource(feed="http://node-a:9400", block_size=BLOCK, hash_seed="0")
TOKENS = tuple(range(100, 100 + 5 * BLOCK + 2))  # 5 full blocks and 2 tokens more
HASHES = block_ids(TOKENS, BLOCK, "0")
PROMPT = b"the same prompt, as bytes " * 40


def salted(salt: str) -> list[int]:
    """The prompt's block ids with a cache salt, keyed as gateway/routing/kv_blocks.py keys it
    (checked against a real vLLM by tests/e2e/test_vllm_cpu.py): the first block only."""
    return block_ids(TOKENS, BLOCK, "0", [(("cache_salt", salt),)])


def route(replica_id: str, kv: KvSource | None = KV) -> Route:
    return Route(
        replica_id=replica_id,
        model="m",
        node="node-a",
        endpoint=f"http://127.0.0.1:1/{replica_id}",
        engine="vllm" if kv else "llamacpp",
        state=ReplicaState.READY,
        kv=kv,
    )


def snapshot(*routes: Route) -> RoutingSnapshot:
    return RoutingSnapshot(RoutingTable(version=1, routes=list(routes)))


def ask(
    tokens: tuple[int, ...] | None = TOKENS,
    salt: str | None = None,
    prompt: bytes = PROMPT,
    session: str | None = None,
) -> RequestKey:
    return RequestKey("m", prompt, session=session, token_ids=tokens, cache_salt=salt)


def chosen(decision: Decision) -> str:
    assert decision.route is not None
    return decision.route.replica_id


def test_the_replica_holding_the_most_leading_blocks_is_chosen() -> None:
    index = KvBlockIndex()
    index.store("a", HASHES[:1])
    index.store("b", HASHES[:3])
    index.store("c", HASHES[1:])  # everything but the first block: no prefix at all
    router = Router(kv_index=index)
    decision = router.choose(snapshot(route("a"), route("b"), route("c")), ask(), {}, now=0.0)
    assert (chosen(decision), decision.reason) == ("b", "kv_prefix")
    assert decision.matched_blocks == 3
    assert decision.predicted_cached_tokens == 3 * BLOCK


def test_an_overloaded_holder_gives_way_to_the_next_longest_then_to_the_least_loaded() -> None:
    index = KvBlockIndex()
    index.store("a", HASHES[:2])
    index.store("b", HASHES[:4])
    router = Router(kv_index=index, margin=OverloadMargin(absolute=4, factor=2.0))
    snap = snapshot(route("a"), route("b"), route("c"))
    within = router.choose(snap, ask(), {"b": 4}, now=0.0)
    assert (chosen(within), within.reason) == ("b", "kv_prefix")
    over = router.choose(snap, ask(), {"b": 5}, now=1.0)
    assert (chosen(over), over.reason, over.matched_blocks) == ("a", "kv_prefix", 2)
    both = router.choose(snap, ask(), {"a": 5, "b": 5}, now=2.0)
    assert (chosen(both), both.reason) == ("c", "fallback_overloaded")
    assert (both.matched_blocks, both.predicted_cached_tokens) == (0, 0)


def test_a_single_block_in_common_is_not_a_match() -> None:
    """As with the approximate index, a match shorter than min_match_blocks (a chat template's
    opening every prompt shares) does not pull requests onto one replica."""
    index = KvBlockIndex()
    index.store("a", HASHES[:1])
    router = Router(kv_index=index, min_match_blocks=2)
    decision = router.choose(snapshot(route("a"), route("b")), ask(), {"a": 1}, now=0.0)
    assert (chosen(decision), decision.reason) == ("b", "new_prefix")


def test_a_fully_cached_prompt_predicts_one_block_less() -> None:
    """An engine recomputes at least the prompt's last token, so a prompt whose blocks are all
    cached takes all but the last block from the cache (vLLM: num_tokens - 1)."""
    exact = TOKENS[: 3 * BLOCK]
    index = KvBlockIndex()
    index.store("a", block_ids(exact, BLOCK, "0"))
    decision = Router(kv_index=index).choose(snapshot(route("a")), ask(exact), {}, now=0.0)
    assert (decision.reason, decision.matched_blocks) == ("kv_prefix", 3)
    assert decision.predicted_cached_tokens == 2 * BLOCK


def test_a_salted_request_does_not_match_blocks_of_the_unsalted_prompt() -> None:
    mine = salted("tenant-1")
    assert not set(mine) & set(HASHES), "the salt changes every block, through the chain"
    index = KvBlockIndex()
    index.store("a", HASHES)
    index.store("b", mine[:2])
    router = Router(kv_index=index)
    snap = snapshot(route("a"), route("b"))
    plain = router.choose(snap, ask(), {}, now=0.0)
    assert (chosen(plain), plain.reason, plain.matched_blocks) == ("a", "kv_prefix", 5)
    theirs = router.choose(snap, ask(salt="tenant-1"), {}, now=1.0)
    assert (chosen(theirs), theirs.reason, theirs.matched_blocks) == ("b", "kv_prefix", 2)
    other = router.choose(snap, ask(salt="tenant-2", prompt=b"x"), {}, now=2.0)
    assert other.reason == "least_load"
    assert other.predicted_cached_tokens == 0


def test_request_block_ids_are_the_engines_hashes() -> None:
    assert list(request_block_ids(TOKENS, KV, None)) == HASHES
    assert list(request_block_ids(TOKENS, KV, "")) == HASHES  # an empty salt is no salt
    assert list(request_block_ids(TOKENS, KV, "s")) == salted("s")
    assert list(request_block_ids(TOKENS, KV, "s", max_blocks=2)) == salted("s")[:2]
    unseeded = KvSource(feed=KV.feed, block_size=BLOCK, hash_seed=None)
    assert list(request_block_ids(TOKENS, unseeded, None)) == block_ids(TOKENS, BLOCK, None)


LORA_PATH = "/models/sql-lora"
WITH_LORA = KvSource(feed=KV.feed, block_size=BLOCK, hash_seed="0", adapters={"sql": LORA_PATH})


def with_adapter(salt: str | None = None) -> list[int]:
    """The prompt's block ids for adapter "sql", keyed as vLLM 0.32 keys them: the adapter's
    ("lora", name, path) on every block, the salt after it on the first."""
    lora = ("lora", "sql", LORA_PATH)
    first = (lora, ("cache_salt", salt)) if salt else (lora,)
    return block_ids(TOKENS, BLOCK, "0", [first] + [(lora,)] * (len(HASHES) - 1))


def test_an_adapters_blocks_carry_its_name_and_path_on_every_block() -> None:
    assert list(request_block_ids(TOKENS, WITH_LORA, None, "sql")) == with_adapter()
    assert list(request_block_ids(TOKENS, WITH_LORA, "s", "sql")) == with_adapter("s")
    assert not set(with_adapter()) & set(HASHES), "the base model's blocks are other blocks"
    # An adapter the replica did not load (or loaded from elsewhere) cannot be predicted.
    assert list(request_block_ids(TOKENS, WITH_LORA, None, "other")) == []
    moved = WITH_LORA.model_copy(update={"adapters": {"sql": "/elsewhere"}})
    assert set(request_block_ids(TOKENS, moved, None, "sql")).isdisjoint(with_adapter())


def test_an_adapter_request_goes_to_the_replica_holding_its_blocks_not_the_bases() -> None:
    index = KvBlockIndex()
    index.store("base", HASHES)  # the same prompt, served by the base model
    index.store("lora", with_adapter()[:3])
    router = Router(kv_index=index)
    snap = snapshot(route("base", WITH_LORA), route("lora", WITH_LORA))
    request = RequestKey("m", PROMPT, token_ids=TOKENS, adapter="sql")
    decision = router.choose(snap, request, {}, now=0.0)
    assert (chosen(decision), decision.reason, decision.matched_blocks) == ("lora", "kv_prefix", 3)
    base = router.choose(snap, ask(), {}, now=1.0)
    assert (chosen(base), base.matched_blocks) == ("base", 5)


def test_replicas_of_another_block_size_compare_by_tokens() -> None:
    wide = KvSource(feed=KV.feed, block_size=8, hash_seed="0")
    index = KvBlockIndex()
    index.store("narrow", HASHES[:3])  # 12 tokens
    index.store("wide", block_ids(TOKENS, 8, "0")[:2])  # 16 tokens
    router = Router(kv_index=index)
    decision = router.choose(snapshot(route("narrow"), route("wide", wide)), ask(), {}, now=0.0)
    assert (chosen(decision), decision.reason, decision.matched_blocks) == ("wide", "kv_prefix", 2)
    assert decision.predicted_cached_tokens == 16


def test_without_a_kv_match_the_approximate_index_and_sessions_route_as_before() -> None:
    index = KvBlockIndex()  # the feeds are down, say: nothing known
    router = Router(kv_index=index)
    snap = snapshot(route("a"), route("b"))
    first = router.choose(snap, ask(), {}, now=0.0)
    assert first.reason == "new_prefix"
    again = router.choose(snap, ask(), {}, now=1.0)
    assert (chosen(again), again.reason) == (chosen(first), "prefix")
    session = router.choose(snap, ask(prompt=b"short", session="s-1"), {}, now=2.0)
    assert session.reason == "session"


Made = tuple[str, str, int, int]


def _decisions(router: Router, snap: RoutingSnapshot, keys: list[RequestKey]) -> list[Made]:
    loads = itertools.cycle([{}, {"a": 3}, {"b": 9}, {"a": 6, "b": 1}])
    return [
        (chosen(d), d.reason, d.matched_blocks, d.predicted_cached_tokens)
        for n, key in enumerate(keys)
        for d in [router.choose(snap, key, next(loads), now=float(n))]
    ]


PROMPTS = [b"system prompt one. " * 30 + b"%d" % n for n in range(4)] + [
    b"system prompt two. " * 30 + b"%d" % n for n in range(4)
]


def test_requests_without_token_ids_route_as_before() -> None:
    index = KvBlockIndex()
    index.store("a", HASHES)
    snap = snapshot(route("a"), route("b"))
    keys = [RequestKey("m", p, session="s" if n % 3 else None) for n, p in enumerate(PROMPTS * 2)]
    decisions = _decisions(Router(kv_index=index), snap, keys)
    assert decisions == _decisions(Router(), snap, keys)
    assert {"prefix", "new_prefix", "fallback_overloaded"} <= {r for _, r, _, _ in decisions}


def test_routes_without_kv_route_exactly_as_before_even_with_token_ids() -> None:
    index = KvBlockIndex()
    index.store("a", HASHES)
    snap = snapshot(route("a", kv=None), route("b", kv=None))
    with_ids = [
        RequestKey("m", p, session="s" if n % 3 else None, token_ids=TOKENS, cache_salt="x")
        for n, p in enumerate(PROMPTS * 2)
    ]
    plain = [RequestKey("m", k.prompt, session=k.session) for k in with_ids]
    decisions = _decisions(Router(kv_index=index), snap, with_ids)
    assert decisions == _decisions(Router(), snap, plain)
    assert all(reason != "kv_prefix" for _, reason, _, _ in decisions)
    assert {"prefix", "new_prefix"} <= {reason for _, reason, _, _ in decisions}


def full_engine(router: Router, replica_id: str, blocks: int, waiting: int = 0) -> None:
    """The engine's metrics say its cache is `blocks` blocks (and one it keeps aside)."""
    sample = LoadSample(
        running=0, waiting=waiting, kv_usage=1.0, taken_at=0.0, kv_blocks=blocks + 1
    )
    router.loads.record(replica_id, sample)


def test_blocks_the_engine_will_evict_first_are_not_predicted() -> None:
    index = KvBlockIndex()
    index.store("a", HASHES)
    router = Router(kv_index=index)
    snap = snapshot(route("a"))
    # A request of this prefix ran and finished: its blocks are the engine's only idle ones.
    first = router.choose(snap, ask(), {}, now=1.0)
    assert first.predicted_cached_tokens == 5 * BLOCK
    ticket = router.sent(route("a"), ask(), first.predicted_cached_tokens)
    router.started(ticket)
    router.finished(ticket)
    full_engine(router, "a", blocks=5)
    # Another prompt sent and not started yet takes two new blocks of the full cache: the
    # prefix's last two, freed first, go before a request sent now is started.
    other = RequestKey("m", b"other", token_ids=tuple(range(900, 900 + BLOCK + 3)))
    waiting = router.sent(route("a"), other, 0)
    decision = router.choose(snap, ask(), {}, now=2.0)
    assert (chosen(decision), decision.matched_blocks) == ("a", 5)
    assert decision.predicted_cached_tokens == 3 * BLOCK
    # Once it has started, its blocks are taken: nothing more will go.
    router.started(waiting)
    assert router.choose(snap, ask(), {}, now=3.0).predicted_cached_tokens == 5 * BLOCK


def test_the_replica_that_will_still_hold_the_most_blocks_wins_over_the_one_holding_more() -> None:
    index = KvBlockIndex()
    index.store("a", HASHES)
    index.store("b", HASHES[:4])
    router = Router(kv_index=index)
    snap = snapshot(route("a"), route("b"))
    assert chosen(router.choose(snap, ask(), {}, now=1.0)) == "a", "5 blocks held against 4"
    # a's cache is full and holds nothing else; its prefix ran and finished, so its blocks are
    # the idle ones. A request waiting there takes two new blocks, evicting the prefix's last
    # two before a request sent now starts: a will hold 3, b (its cache not full) still 4.
    ticket = router.sent(route("a"), ask(), 5 * BLOCK)
    router.started(ticket)
    router.finished(ticket)
    full_engine(router, "a", blocks=5)
    other = RequestKey("m", b"other", token_ids=tuple(range(900, 900 + BLOCK + 3)))
    router.sent(route("a"), other, 0)
    decision = router.choose(snap, ask(), {}, now=2.0)
    assert (chosen(decision), decision.reason, decision.matched_blocks) == ("b", "kv_prefix", 4)
    assert decision.predicted_cached_tokens == 4 * BLOCK


def test_without_the_engines_cache_size_the_index_alone_predicts() -> None:
    index = KvBlockIndex()
    index.store("a", HASHES)
    router = Router(kv_index=index)
    other = RequestKey("m", b"other", token_ids=tuple(range(900, 900 + 10 * BLOCK)))
    router.sent(route("a"), other, 0)
    decision = router.choose(snapshot(route("a")), ask(), {}, now=1.0)
    assert decision.predicted_cached_tokens == 5 * BLOCK


def test_block_ids_are_hashed_once_however_often_they_are_read() -> None:
    hashed: list[int] = []

    def counting() -> Iterator[int]:
        for block in HASHES:
            hashed.append(block)
            yield block

    ids = BlockIds(counting())
    assert list(itertools.islice(ids, 2)) == HASHES[:2]
    assert ids.first(3) == HASHES[:3]
    assert list(ids) == HASHES
    assert ids.first(99) == HASHES
    assert hashed == HASHES  # each block once, in order


def test_the_decision_hands_its_hashed_blocks_to_the_note_of_what_was_sent() -> None:
    """The match, the eviction estimate and the note read one hashing of the prompt: the
    note is the same as hashing afresh."""
    index = KvBlockIndex()
    index.store("a", HASHES[:3])
    router = Router(kv_index=index)
    full_engine(router, "a", blocks=64)
    decision = router.choose(snapshot(route("a")), ask(), {}, now=1.0)
    assert isinstance(decision.kv_blocks, BlockIds)
    assert decision.kv_blocks.first(3) == HASHES[:3]
    ticket = router.sent(route("a"), ask(), 3 * BLOCK, decision)
    fresh = Router(kv_index=index)
    fresh_ticket = fresh.sent(route("a"), ask(), 3 * BLOCK)
    assert ticket is not None
    assert fresh_ticket is not None
    assert ticket.kv is not None
    assert fresh_ticket.kv is not None
    noted, afresh = (
        router.kv.pressure._sent["a"][ticket.kv],
        fresh.kv.pressure._sent["a"][fresh_ticket.kv],
    )
    assert (noted.blocks, noted.need) == (afresh.blocks, afresh.need)
    assert list(noted.blocks) == HASHES


def test_blocks_a_request_sent_ahead_will_store_are_predicted() -> None:
    """The engine holds two of the prompt's blocks; a request with the same prompt sent there
    just before, not started yet, will store the rest before this one is started."""
    index = KvBlockIndex()
    index.store("a", HASHES[:2])
    router = Router(kv_index=index)
    snap = snapshot(route("a"))
    first = router.choose(snap, ask(), {}, now=1.0)
    assert first.predicted_cached_tokens == 2 * BLOCK
    ahead = router.sent(route("a"), ask(), first.predicted_cached_tokens, first)
    second = router.choose(snap, ask(), {}, now=2.0)
    assert second.matched_blocks == 2  # routing still sees what the engine reports
    assert second.predicted_cached_tokens == 5 * BLOCK
    router.finished(ahead)  # it failed before storing anything
    assert router.choose(snap, ask(), {}, now=3.0).predicted_cached_tokens == 2 * BLOCK


def test_a_request_sent_before_its_token_ids_gets_its_blocks_when_they_come() -> None:
    """A prompt starting a new prefix is sent while its token ids are asked aside: until they
    come it counts for nothing it will store; once they come, as if sent with them, so a
    request of the same prompt after it is predicted to find them; and it frees them, last
    block first, into the eviction order when it finishes."""
    index = KvBlockIndex()
    index.store("a", HASHES[:2])
    router = Router(kv_index=index)
    snap = snapshot(route("a"))
    later = ask(tokens=None)
    ahead = router.sent(route("a"), RequestKey("m", PROMPT, tokens_later=True), 0)
    assert ahead is not None
    assert ahead.kv is not None
    assert router.sent(route("a"), later, 0) is None, "no ids and none coming: not noted"
    assert router.choose(snap, ask(), {}, now=1.0).predicted_cached_tokens == 2 * BLOCK
    router.tokens_arrived(ahead, route("a"), RequestKey("m", PROMPT), TOKENS)
    assert router.choose(snap, ask(), {}, now=2.0).predicted_cached_tokens == 5 * BLOCK
    noted = router.kv.pressure._sent["a"][ahead.kv]
    assert (noted.blocks, noted.need) == (tuple(HASHES), 6)
    # Twice, or after it finished: nothing changes.
    router.started(ahead)
    router.finished(ahead)
    router.tokens_arrived(ahead, route("a"), RequestKey("m", PROMPT), TOKENS[:4])
    assert router.kv.pressure.in_flight_run("a", HASHES) == 0
    assert list(router.kv.pressure._freed["a"]) == HASHES[::-1]
