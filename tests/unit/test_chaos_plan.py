"""How `make chaos` picks its rounds: seeded, every target dealt before any repeats, freezes in
the asked range; and which engine it hits."""

import random

import pytest

from bench.chaos.checks import AgentShard, EngineProcess
from bench.chaos.inject import NoVictim, pick_engine
from bench.chaos.plan import (
    CANCEL,
    FREEZE,
    KILL,
    PROCESS_TARGETS,
    RESET,
    TARGETS,
    TERMINATE,
    WORKFLOW_TARGETS,
    parse_targets,
    plan_rounds,
)


def test_the_same_seed_gives_the_same_plan() -> None:
    assert plan_rounds(12, seed=4) == plan_rounds(12, seed=4)
    assert plan_rounds(12, seed=4) != plan_rounds(12, seed=5)


def test_every_target_is_hit_before_any_is_hit_twice() -> None:
    for seed in range(20):
        faults = plan_rounds(2 * len(TARGETS), seed)
        first, second = faults[: len(TARGETS)], faults[len(TARGETS) :]
        assert sorted(f.target for f in first) == sorted(TARGETS)
        assert sorted(f.target for f in second) == sorted(TARGETS)


def test_freezes_last_within_the_range_and_kills_do_not_freeze() -> None:
    faults = plan_rounds(200, seed=1, targets=PROCESS_TARGETS, freeze_range=(5.0, 9.0))
    assert {f.action for f in faults} == {KILL, FREEZE}
    assert all(5.0 <= f.freeze_s <= 9.0 for f in faults if f.action == FREEZE)
    assert all(f.freeze_s == 0.0 for f in faults if f.action == KILL)
    with pytest.raises(ValueError, match="want 0 < min <= max"):
        plan_rounds(1, seed=1, freeze_range=(9.0, 5.0))


def test_workflows_are_terminated_cancelled_or_reset_and_processes_killed_or_frozen() -> None:
    faults = plan_rounds(300, seed=3)
    on_workflows = {f.action for f in faults if f.target in WORKFLOW_TARGETS}
    on_processes = {f.action for f in faults if f.target in PROCESS_TARGETS}
    assert on_workflows == {TERMINATE, CANCEL, RESET}
    assert on_processes == {KILL, FREEZE}
    assert {f.describe() for f in faults if f.target == "node-workflow"} == {
        "terminate node-workflow",
        "cancel node-workflow",
        "reset node-workflow",
    }


def test_actions_leave_out_the_targets_they_do_not_apply_to() -> None:
    faults = plan_rounds(20, seed=2, actions=(TERMINATE,))
    assert {f.target for f in faults} == set(WORKFLOW_TARGETS)
    assert {f.action for f in faults} == {TERMINATE}
    with pytest.raises(ValueError, match="no target takes"):
        plan_rounds(5, seed=2, targets=("agent",), actions=(RESET,))


def test_only_limits_the_targets() -> None:
    only = parse_targets("engine, agent")
    assert only == ("agent", "engine")
    assert {f.target for f in plan_rounds(10, seed=2, targets=only)} == {"agent", "engine"}
    with pytest.raises(ValueError, match="kernel"):
        parse_targets("agent,kernel")
    with pytest.raises(ValueError, match="unknown target"):
        parse_targets(" , ")


def test_an_engine_victim_is_a_live_one() -> None:
    shards = {
        "m-0": AgentShard("m-0", 10, 1, 18000),  # its process is gone
        "m-1": AgentShard("m-1", 20, 2, 18001),
    }
    live = [EngineProcess(20, 2, 18001), EngineProcess(30, 3, 18002)]
    rng = random.Random(0)
    assert {pick_engine(shards, live, rng).replica_id for _ in range(20)} == {"m-1"}
    with pytest.raises(NoVictim):
        pick_engine(shards, live[1:], rng)
