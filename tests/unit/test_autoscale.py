"""The autoscaler's decisions over time, as an operator would describe them."""

import itertools
from datetime import UTC, datetime, timedelta

from workflows.autoscale import decide
from workflows.contracts import Autoscale, AutoscaleState, EngineLoad

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
POLICY = Autoscale(queue_per_replica=4, sustained_s=30, quiet_s=300, idle_s=900)


def engines(waiting: int = 0, running: int = 0, work: float = 0.0, n: int = 1) -> list[EngineLoad]:
    return [
        EngineLoad(replica_id=f"m-{i}", waiting=waiting // n, running=running // n, work=work / n)
        for i in range(n)
    ]


class Run:
    """Feeds looks every 15 s, as the model workflow does, and keeps the replica count."""

    def __init__(self, replicas: int, min_replicas: int = 0, max_replicas: int = 4) -> None:
        self.replicas, self.min, self.max = replicas, min_replicas, max_replicas
        self.state = AutoscaleState()
        self.now = T0
        self.reasons: list[str] = []

    def look(self, loads: list[EngineLoad], seconds: int = 15) -> int:
        decision = decide(POLICY, self.replicas, self.min, self.max, self.state, loads, self.now)
        self.state, self.replicas = decision.state, decision.replicas
        if decision.reason:
            self.reasons.append(decision.reason)
        self.now += timedelta(seconds=seconds)
        return self.replicas


def test_a_burst_shorter_than_the_sustained_period_adds_nothing() -> None:
    run = Run(replicas=1)
    assert run.look(engines(waiting=20, running=2, work=10)) == 1
    assert run.look(engines(waiting=0, running=2, work=20)) == 1  # the queue drained
    assert run.look(engines(waiting=20, running=2, work=30)) == 1


def test_sustained_queueing_adds_one_replica_per_sustained_period_up_to_max() -> None:
    run = Run(replicas=1, max_replicas=3)
    counts = [run.look(engines(waiting=40, running=4, work=10.0 * i, n=1)) for i in range(12)]
    assert counts[:2] == [1, 1]
    assert counts[2] == 2  # 30 s of queueing
    assert max(counts) == 3
    assert counts[-1] == 3
    assert "40 requests waiting" in run.reasons[0]


def test_quiet_replicas_go_one_at_a_time_but_not_below_the_floor() -> None:
    run = Run(replicas=3, min_replicas=1)
    counts = []
    for i in range(60):  # 15 minutes of a trickle: running, nothing waiting
        counts.append(run.look(engines(running=1, work=float(i))))
    assert counts[0] == 3
    assert counts[-1] == 1  # down to min_replicas
    assert sorted(counts, reverse=True) == counts  # only ever down, one step at a time
    assert all(a - b in (0, 1) for a, b in itertools.pairwise(counts))


def test_an_idle_model_goes_to_zero_and_only_a_request_brings_it_back() -> None:
    run = Run(replicas=1)
    run.look(engines(running=1, work=5))  # served a request
    counts = [run.look(engines(work=5)) for _ in range(61)]  # 15 minutes with nothing
    assert counts[-1] == 0
    assert any("no request for" in r for r in run.reasons)
    assert run.look([]) == 0  # at zero, the autoscaler itself never starts one


def test_min_replicas_above_zero_never_goes_to_zero() -> None:
    run = Run(replicas=2, min_replicas=2)
    assert all(run.look(engines(work=1)) == 2 for _ in range(200))


def test_unseen_engines_are_not_taken_for_idle_ones() -> None:
    run = Run(replicas=1)
    run.look(engines(running=1, work=1))
    blind = [EngineLoad(replica_id="m-0", seen=False)]
    # The node did not answer for 15 minutes: its engine may be busy, so nothing changes.
    assert all(run.look(blind) == 1 for _ in range(61))
    assert run.state.last_work == 1
