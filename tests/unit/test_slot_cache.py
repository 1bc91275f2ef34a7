"""The replay of llama-server's slot choice for replicas whose prompt cache is their slots
(`--cache-ram 0`), and the routing it changes: a request that misses wherever it goes goes where
it evicts no prompt that another request will want."""

from __future__ import annotations

from gateway.routing import RequestKey, Router, RoutingSnapshot, Sent
from gateway.routing.prefix_index import BLOCK_BYTES, block_hashes
from gateway.routing.slot_cache import SlotBoard, SlotReplay, SlotView
from tests.unit.test_routing_policy import route as llamacpp_route
from workflows.contracts import Profile, ReplicaState, Route, RoutingTable
from workflows.contracts.models import ModelSpec
from workflows.contracts.replicas import ReplicaCarried, ReplicaInput, ReplicaView
from workflows.replica.rules import replica_route


def prompt(group: str, question: str = "") -> bytes:
    """Four full blocks of a group's system prompt, then a question of its own."""
    return group.encode() * (4 * BLOCK_BYTES) + question.encode()


X, Y, Z = (block_hashes(prompt(g, "?" * 40)) for g in "xyz")


def test_a_prompt_takes_the_idle_slot_holding_its_prefix_else_the_least_recently_used() -> None:
    slots = SlotReplay(2)
    slots.start(1, X)
    slots.start(2, Y)
    slots.finish(1)
    slots.finish(2)
    assert slots.view(X) == SlotView(found=4, evicts=False, waits=False)
    # A new prompt takes the slot used longest ago (X's), the only copy of X there.
    assert slots.view(Z) == SlotView(found=0, evicts=True, waits=False)
    slots.start(3, Z)
    assert slots.view(X).found == 0
    assert slots.view(Y).found == 4


def test_a_prompt_whose_slot_is_busy_takes_the_other_and_evicts_what_it_held() -> None:
    slots = SlotReplay(2)
    slots.start(1, X)
    slots.start(2, Y)
    slots.finish(2)
    # X's only slot is busy: a second X request would take Y's, its only copy.
    assert slots.view(X) == SlotView(found=0, evicts=True, waits=False)
    # With a copy in another slot, or an empty one, nothing is lost.
    spare = SlotReplay(2)
    spare.start(1, Z)
    assert spare.view(X) == SlotView(found=0, evicts=False, waits=False)
    spare.start(2, Z)
    spare.finish(2)
    assert spare.view(X) == SlotView(found=0, evicts=False, waits=False)


def test_with_every_slot_busy_a_request_waits_and_takes_the_first_to_free_in_turn() -> None:
    slots = SlotReplay(2)
    slots.start(1, X)
    slots.start(2, Y)
    # Both busy: a request would take the slot taken first (X's) as it frees.
    assert slots.view(X) == SlotView(found=4, evicts=False, waits=True)
    assert slots.view(Z) == SlotView(found=0, evicts=True, waits=True)
    slots.start(3, Z)
    # With Z waiting for X's slot, the next request would get Y's.
    assert slots.view(Y) == SlotView(found=4, evicts=False, waits=True)
    slots.start(4, X)
    slots.finish(4)  # cancelled while it waited: it never takes a slot
    slots.finish(1)  # X's slot frees: Z, waiting, takes it
    assert slots.view(X) == SlotView(found=0, evicts=True, waits=True)
    slots.finish(2)
    assert slots.view(Y) == SlotView(found=4, evicts=False, waits=False)
    assert slots.view(X).found == 0


def test_the_board_forgets_replicas_that_left_and_restarts_one_whose_slots_changed() -> None:
    board = SlotBoard()
    ticket = board.sent("r-0", 2, X)
    board.finished("r-0", ticket)
    assert board.view("r-0", 2, X).found == 4
    assert board.view("r-0", 3, X).found == 0, "restarted with another slot count"
    board.sent("r-0", 3, X)
    board.retain(["r-1"])
    assert board.view("r-0", 3, X).found == 0
    board.finished("r-9", 0)  # a replica it never saw: nothing to do


def test_only_llamacpp_started_with_cache_ram_0_has_its_slots_as_its_cache() -> None:
    assert Profile(parallel=3, args=["--cache-ram", "0"]).prompt_slots == 3
    assert Profile(parallel=3, args=["-cram=0", "-np", "5"]).prompt_slots == 5
    assert Profile(parallel=3).prompt_slots is None, "llama.cpp's default keeps 8 GiB of prompts"
    assert Profile(args=["--cache-ram", "0", "--cache-ram", "512"]).prompt_slots is None
    assert Profile(engine="vllm", args=["--cache-ram", "0"]).prompt_slots is None


def route(replica_id: str, slots: int | None) -> Route:
    return llamacpp_route(replica_id).model_copy(update={"prompt_slots": slots})


def fleet(slots: int | None) -> tuple[Router, RoutingSnapshot, Sent | None]:
    """Three replicas of two slots: groups x and y on r-0, w on r-1, z on r-2, each request
    answered; then an x request still running on r-0."""
    routes = {r: route(r, slots) for r in ("r-0", "r-1", "r-2")}
    snap = RoutingSnapshot(RoutingTable(version=1, routes=list(routes.values())))
    router = Router()
    for replica_id, group in (("r-0", "x"), ("r-0", "y"), ("r-1", "w"), ("r-2", "z")):
        key = RequestKey("m", prompt(group, "first"))
        router.index.insert_hashes(replica_id, router.index.hashes(key.prompt), 0.0)
        router.finished(router.sent(routes[replica_id], key, 0))
    running = router.sent(routes["r-0"], RequestKey("m", prompt("x", "running")), 0)
    return router, snap, running


def test_a_request_that_would_evict_another_groups_only_copy_goes_where_a_slot_is_spare() -> None:
    router, snap, _ = fleet(slots=2)
    # Loads level (as another gateway's count would leave them): only the slots decide.
    inflight: dict[str, int] = {}
    decision = router.choose(snap, RequestKey("m", prompt("x", "again")), inflight, now=1.0)
    assert decision.route is not None
    assert decision.route.replica_id in {"r-1", "r-2"}
    assert decision.reason == "least_load"
    # y's request still finds y where it was.
    back = router.choose(snap, RequestKey("m", prompt("y", "next")), inflight, now=2.0)
    assert back.route is not None
    assert (back.route.replica_id, back.reason) == ("r-0", "prefix")


def test_without_slots_as_the_cache_the_prefix_index_routes_as_before() -> None:
    router, snap, _ = fleet(slots=None)
    decision = router.choose(snap, RequestKey("m", prompt("x", "again")), {"r-0": 1}, now=1.0)
    assert decision.route is not None
    assert (decision.route.replica_id, decision.reason) == ("r-0", "prefix")


def test_an_idle_slot_holding_the_prefix_keeps_its_requests() -> None:
    router, snap, running = fleet(slots=2)
    # The running x request ends: its slot, holding x, is idle again.
    router.finished(running)
    decision = router.choose(snap, RequestKey("m", prompt("x", "again")), {}, now=1.0)
    assert decision.route is not None
    assert (decision.route.replica_id, decision.reason) == ("r-0", "prefix")


def test_the_replicas_route_says_its_slots_are_its_cache_and_an_old_route_reads_as_not() -> None:
    profile = Profile(parallel=2, args=["--cache-ram", "0"])
    spec = ModelSpec(name="smol", weights="/w.gguf", profiles=[profile])
    carried = ReplicaCarried(
        view=ReplicaView(replica_id="smol-0", model="smol", state=ReplicaState.READY)
    )
    published = replica_route(ReplicaInput(replica_id="smol-0", model=spec), carried, "n", "h:1")
    assert published.prompt_slots == 2
    old = published.model_dump()
    del old["prompt_slots"]
    assert Route.model_validate(old).prompt_slots is None
