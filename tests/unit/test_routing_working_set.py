"""Where new prefixes go: the replica recently sent the least distinct prompt (working_set.py)."""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Sequence

import pytest

from gateway.routing import RequestKey, Router, RoutingSnapshot
from gateway.routing.loads import LoadSample
from gateway.routing.working_set import WorkingSets
from kv.index import KvBlockIndex
from tests.unit.test_router_kv import route as kv_route
from tests.unit.test_routing_policy import chosen, snapshot
from workflows.contracts import RoutingTable


def group_prompt(group: int, question: int) -> bytes:
    """A tenant's system prompt (about 1 KB, four 256-byte blocks) and a question of its own."""
    return (b"You are the assistant of tenant %d. " % group) * 30 + b"Question %d?" % question


def test_a_prefix_counts_once_at_its_longest_prompt_until_its_window_passes() -> None:
    sets = WorkingSets(root_blocks=2, window_s=10.0)
    sets.sent("a", [1, 2, 3], now=0.0)
    sets.sent("a", [1, 2, 3, 4, 5], now=1.0)  # the same prefix, a longer prompt
    sets.sent("a", [1, 2, 4], now=2.0)  # the same prefix again, shorter
    assert sets.blocks("a", now=2.0) == 5
    sets.sent("a", [1, 9, 9], now=3.0)  # another prefix: its second block differs
    assert sets.blocks("a", now=3.0) == 8
    sets.sent("a", [7], now=3.0)  # one block: too short to start a prefix
    assert sets.blocks("a", now=3.0) == 8
    assert sets.blocks("b", now=3.0) == 0
    # Ten seconds after each was last sent, it no longer counts.
    assert sets.blocks("a", now=12.5) == 3
    assert sets.blocks("a", now=13.0) == 0


def test_the_prefixes_a_replica_keeps_are_bounded_and_leave_with_it() -> None:
    sets = WorkingSets(root_blocks=1, max_prefixes=3)
    for n in range(10):
        sets.sent("a", [n, n], now=float(n))
    assert sets.blocks("a", now=10.0) == 6, "the three sent last, of two blocks each"
    sets.sent("b", [1], now=10.0)
    sets.retain(["b"])
    assert sets.blocks("a", now=10.0) == 0
    assert sets.blocks("b", now=10.0) == 1
    with pytest.raises(ValueError, match="must be positive"):
        WorkingSets(window_s=0)


def test_a_new_prefix_goes_where_fewer_prefixes_live_even_if_busier() -> None:
    router = Router()
    snap = snapshot("r-0", "r-1")
    first = router.choose(snap, RequestKey("m", group_prompt(0, 0)), {}, now=0.0)
    holder = chosen(first)
    other = "r-1" if holder == "r-0" else "r-0"
    # The other replica is busier, within the overload margin: the new prefix still goes there.
    second = router.choose(snap, RequestKey("m", group_prompt(1, 0)), {other: 3}, now=1.0)
    assert (chosen(second), second.reason) == (other, "new_prefix")
    # Past the margin, load wins: the least loaded takes it.
    third = router.choose(snap, RequestKey("m", group_prompt(2, 0)), {other: 9}, now=2.0)
    assert (chosen(third), third.reason) == (holder, "new_prefix")
    # A prompt too short to start a prefix goes by load alone.
    short = router.choose(snap, RequestKey("m", b"hello"), {holder: 1}, now=3.0)
    assert (chosen(short), short.reason) == (other, "least_load")


@pytest.mark.parametrize("seed", range(8))
def test_interleaved_groups_split_evenly_whatever_the_loads(seed: int) -> None:
    """Eight groups' requests interleaved, as in the KV benchmark, with loads that vary within
    the margin: each replica ends up serving four groups, all of each group's requests on one
    replica, as an oracle that pins the groups would."""
    rng = random.Random(seed)
    router = Router()
    snap = snapshot("r-0", "r-1")
    where: dict[int, set[str]] = {}
    for turn in range(4):
        order = list(range(8))
        rng.shuffle(order)
        for group in order:
            loads = {"r-0": rng.randrange(4), "r-1": rng.randrange(4)}
            decision = router.choose(snap, RequestKey("m", group_prompt(group, turn)), loads)
            where.setdefault(group, set()).add(chosen(decision))
    assert all(len(replicas) == 1 for replicas in where.values()), where
    assert Counter(next(iter(r)) for r in where.values()) == {"r-0": 4, "r-1": 4}


def test_a_new_prefix_needs_no_tokens_unless_an_engine_holds_what_another_sender_left() -> None:
    index = KvBlockIndex()
    router = Router(kv_index=index)
    routes = [kv_route("a"), kv_route("b")]
    snap = RoutingSnapshot(RoutingTable(version=1, routes=routes))
    assert router.needs_no_tokens(group_prompt(0, 0), routes, now=0.0)
    assert not router.needs_no_tokens(b"short", routes, now=0.0), "too short to start a prefix"
    sent = chosen(router.choose(snap, RequestKey("m", group_prompt(0, 0)), {}, now=0.0))
    assert not router.needs_no_tokens(group_prompt(0, 1), routes, now=1.0), "sent before"
    # Blocks on the engine this gateway sent nothing: another gateway's, or from before a
    # restart; they might be any prefix, for the working set's window.
    other = "b" if sent == "a" else "a"
    index.store(other, [1, 2, 3])
    assert not router.needs_no_tokens(group_prompt(1, 0), routes, now=2.0)
    router.choose(snap, RequestKey("m", group_prompt(1, 0)), {sent: 9}, now=3.0)
    assert not router.needs_no_tokens(group_prompt(2, 0), routes, now=100.0)
    assert router.needs_no_tokens(group_prompt(2, 0), routes, now=122.5)
    assert not Router("least_load").needs_no_tokens(group_prompt(3, 0), routes, now=0.0)


def test_a_new_prefix_asks_for_tokens_where_the_engine_serves_another_senders_requests() -> None:
    index = KvBlockIndex()
    router = Router(kv_index=index)
    routes = [kv_route("a"), kv_route("b")]
    snap = RoutingSnapshot(RoutingTable(version=1, routes=routes))
    for group, replica in ((0, "a"), (1, "b")):
        loads = {"a": 0, "b": 9} if replica == "a" else {"a": 9, "b": 0}
        assert (
            chosen(router.choose(snap, RequestKey("m", group_prompt(group, 0)), loads)) == replica
        )
    # This gateway sent both engines its own prefixes, and they hold blocks: its own, as far
    # as it can tell, so a new prefix needs no tokens.
    index.store("a", [1, 2, 3])
    index.store("b", [4, 5, 6])
    assert router.needs_no_tokens(group_prompt(2, 0), routes)
    # Then an engine's gauges show a request this gateway did not send (another gateway's):
    # its blocks might be any prefix, for the working set's window, past the next sample.
    router.loads.record(
        "b", LoadSample(running=1, waiting=0, kv_usage=0.1, taken_at=time.monotonic())
    )
    assert not router.needs_no_tokens(group_prompt(2, 0), routes)
    router.loads.record(
        "b", LoadSample(running=0, waiting=0, kv_usage=0.1, taken_at=time.monotonic())
    )
    assert not router.needs_no_tokens(group_prompt(2, 0), routes)
    later = time.monotonic() + router.working_sets.window_s + 1
    router.choose(snap, RequestKey("m", group_prompt(3, 0)), {"a": 0, "b": 0}, now=later)
    router.choose(snap, RequestKey("m", group_prompt(4, 0)), {"a": 0, "b": 0}, now=later)
    assert router.needs_no_tokens(group_prompt(5, 0), routes, now=later + 1)


def test_a_prompt_hashed_once_routes_as_one_hashed_at_each_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Router.prompt_keys, handed to needs_no_tokens and in the RequestKey, gives the same
    answers and choices (a retry's included) as hashing the prompt at each step, hashed once."""
    routes = [kv_route("a"), kv_route("b")]
    snap = RoutingSnapshot(RoutingTable(version=1, routes=routes))
    once, each = Router(kv_index=KvBlockIndex()), Router(kv_index=KvBlockIndex())
    hashed = Counter[bytes]()
    hashes = once.index.hashes

    def counted(prompt: bytes) -> Sequence[int]:
        hashed[prompt] += 1
        return hashes(prompt)

    monkeypatch.setattr(once.index, "hashes", counted)
    prompts = [group_prompt(g, q) for q in range(3) for g in range(4)] + [b"short"]
    for n, prompt in enumerate(prompts):
        now, loads = float(n), {"a": n % 3, "b": n % 2}
        keys = once.prompt_keys(prompt)
        assert once.needs_no_tokens(prompt, routes, now, keys) == each.needs_no_tokens(
            prompt, routes, now
        )
        for exclude in ((), ("a",)):
            keyed = once.choose(
                snap, RequestKey("m", prompt, prompt_keys=keys), loads, exclude, now
            )
            plain = each.choose(snap, RequestKey("m", prompt), loads, exclude, now)
            assert (chosen(keyed), keyed.reason, keyed.matched_blocks) == (
                chosen(plain),
                plain.reason,
                plain.matched_blocks,
            )
    assert hashed == {prompt: 1 for prompt in prompts}
    assert Router("least_load").prompt_keys(prompts[0]) is None
