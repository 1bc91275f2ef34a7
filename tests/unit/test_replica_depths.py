"""A replica's depth follows what its engine runs at once, from the engine's own gauges."""

from gateway.admission import ReplicaDepths


def test_a_replica_not_yet_sampled_starts_small_and_one_never_sampled_at_the_ceiling() -> None:
    depths = ReplicaDepths(ceiling=128, first=4)
    # Until its engine's gauges speak: a flood fills its engine's queue by at most 4.
    assert depths.depth("r") == 4
    # An external endpoint is never scraped; an engine that answered without gauges never
    # will be: both are held only to the ceiling.
    assert depths.depth("ext", gauged=False) == 128
    depths.ungauged("bare")
    assert depths.depth("bare") == 128
    # Gauges that appear later (the engine restarted with them) are learnt from.
    depths.observe("bare", running=6, waiting=2, held_back=True)
    assert depths.depth("bare") == 6


def test_an_engine_without_gauges_keeps_the_slots_its_route_gives() -> None:
    depths = ReplicaDepths(ceiling=128, first=4)
    depths.ungauged("r")
    assert depths.depth("r", slots=2) == 2


def test_an_engine_with_a_queue_runs_all_it_can() -> None:
    depths = ReplicaDepths(ceiling=128)
    depths.observe("r", running=4, waiting=7, held_back=True)
    assert depths.depth("r") == 4


def test_the_depth_doubles_until_the_engine_first_queues_then_grows_by_one() -> None:
    depths = ReplicaDepths(ceiling=128, first=4)
    depths.observe("r", running=0, waiting=0, held_back=False)  # scraped while idle
    seen = []
    # An engine that runs 40 at once; the gateway keeps it as full as the depth allows.
    for _ in range(12):
        depth = depths.depth("r")
        running, waiting = min(depth, 40), max(0, depth - 40)
        depths.observe("r", running, waiting, held_back=True)
        seen.append(depths.depth("r"))
    assert seen[:4] == [8, 16, 32, 64]
    assert seen[4] == 40  # it queued: its depth is what it ran
    assert set(seen[5:]) <= {40, 41}  # probing one above, put back when it queues


def test_nothing_held_back_nothing_grows() -> None:
    depths = ReplicaDepths(ceiling=128, first=4)
    depths.observe("r", running=4, waiting=0, held_back=False)
    assert depths.depth("r") == 4


def test_replicas_that_left_are_forgotten() -> None:
    depths = ReplicaDepths(ceiling=128)
    depths.observe("a", 2, 1, False)
    depths.observe("b", 3, 1, False)
    depths.retain({"b"})
    assert depths.learnt() == {"b": 3}


def test_a_replica_whose_route_gives_its_slots_is_held_to_them_and_learns_nothing() -> None:
    depths = ReplicaDepths(ceiling=128, first=4)
    assert depths.depth("r", slots=2) == 2
    # The engine's gauges cannot move it: llama.cpp never runs more than its slots.
    depths.observe("r", running=2, waiting=0, held_back=True)
    depths.observe("r", running=1, waiting=3, held_back=True)
    assert depths.depth("r", slots=2) == 2
    assert depths.learnt() == {"r": 2}
    assert depths.depth("r", slots=500) == 128, "never past the gateway's ceiling"
