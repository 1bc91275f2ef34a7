"""How many replicas a model should have, from what its engines say. Pure: the model workflow
feeds it a look at the engines and the time, and keeps the state it returns.

Out on sustained queueing (one step per `sustained_s`, so a burst does not add a replica per
look); in by one after a quiet period; to zero after `idle_s` with no work at all when
min_replicas is 0. Never outside min_replicas..max_replicas.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from workflows.contracts import Autoscale, AutoscaleState, EngineLoad, LoadTotals


@dataclass(frozen=True)
class Decision:
    replicas: int
    state: AutoscaleState
    reason: str = ""


def decide(
    policy: Autoscale,
    replicas: int,
    min_replicas: int,
    max_replicas: int,
    state: AutoscaleState,
    engines: list[EngineLoad] | LoadTotals,
    now: datetime,
) -> Decision:
    """`engines`: each engine's load, or their sums (LoadTotals), which decide the same."""
    load = engines if isinstance(engines, LoadTotals) else LoadTotals.of(engines)
    if load.unseen and not load.seen:
        return Decision(replicas, state)  # no engine answered: unknown is not idle
    waiting = load.waiting
    running = load.running
    work = load.work
    # A counter that moved (either way: an engine restart resets it) means requests were served.
    served = state.last_work is not None and work != state.last_work
    active = waiting > 0 or running > 0 or served
    new = AutoscaleState(
        queueing_since=state.queueing_since,
        quiet_since=state.quiet_since,
        last_active=now if active or state.last_active is None else state.last_active,
        last_work=work,
    )
    if replicas == 0:
        return Decision(replicas, new)  # only a request wakes a model at zero

    per_replica = waiting / max(load.seen, 1)
    if per_replica > policy.queue_per_replica:
        new.queueing_since = new.queueing_since or now
        new.quiet_since = None
        sustained = now - new.queueing_since >= timedelta(seconds=policy.sustained_s)
        if sustained and replicas < max_replicas:
            new.queueing_since = None  # the next step waits its own sustained period
            return Decision(
                replicas + 1, new, f"{waiting} requests waiting on {load.seen} replica(s)"
            )
        return Decision(replicas, new)
    new.queueing_since = None

    idle_for = now - (new.last_active or now)
    if min_replicas == 0 and idle_for >= timedelta(seconds=policy.idle_s):
        new.quiet_since = None
        return Decision(0, new, f"no request for {int(idle_for.total_seconds())}s")

    floor = max(min_replicas, 1)
    if waiting == 0 and replicas > floor:
        new.quiet_since = new.quiet_since or now
        if now - new.quiet_since >= timedelta(seconds=policy.quiet_s):
            new.quiet_since = None
            return Decision(replicas - 1, new, f"nothing waiting for {policy.quiet_s:.0f}s")
        return Decision(replicas, new)
    new.quiet_since = None
    return Decision(replicas, new)
