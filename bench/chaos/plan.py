"""Which process each round hits, and how: a seeded plan, so a run can be repeated exactly.

Targets are dealt like cards: every target once, in random order, before any repeats. Pure
random draws would often leave a process untouched in a short run (five rounds over five
targets miss at least one about 96% of the time), and a campaign that never froze Temporal
says nothing about the fault the whole issue started from.

Processes are killed or frozen; workflows (the node's, a ready replica's, the model's) are
terminated, cancelled or reset to their first workflow task, as an operator can in the Temporal
UI or CLI with one click (workflow_faults.py)."""

import random
from dataclasses import dataclass

PROCESS_TARGETS = ("agent", "control", "temporal", "gateway", "engine")
WORKFLOW_TARGETS = ("node-workflow", "replica-workflow", "model-workflow")
TARGETS = PROCESS_TARGETS + WORKFLOW_TARGETS
KILL, FREEZE = "kill", "freeze"
TERMINATE, CANCEL, RESET = "terminate", "cancel", "reset"
ACTIONS = (KILL, FREEZE, TERMINATE, CANCEL, RESET)


def actions_on(target: str) -> tuple[str, ...]:
    """What can be done to a target: a process is killed or frozen, a workflow terminated,
    cancelled or reset."""
    return (KILL, FREEZE) if target in PROCESS_TARGETS else (TERMINATE, CANCEL, RESET)


@dataclass(frozen=True)
class Fault:
    target: str
    action: str  # one of ACTIONS, as actions_on(target) allows
    freeze_s: float = 0.0  # how long the process stays stopped (FREEZE only)

    def describe(self) -> str:
        if self.action == FREEZE:
            return f"freeze {self.target} {self.freeze_s:.0f}s"
        return f"{self.action} {self.target}"


def parse_targets(text: str) -> tuple[str, ...]:
    """`--only agent,engine`: the named targets, in TARGETS order; unknown names refused."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = sorted(set(names) - set(TARGETS))
    if unknown or not names:
        raise ValueError(f"unknown target(s) {unknown or text!r}; choose from {','.join(TARGETS)}")
    return tuple(t for t in TARGETS if t in names)


def plan_rounds(
    rounds: int,
    seed: int,
    targets: tuple[str, ...] = TARGETS,
    freeze_range: tuple[float, float] = (5.0, 70.0),
    actions: tuple[str, ...] = ACTIONS,
) -> list[Fault]:
    """`rounds` faults; a target none of `actions` applies to is left out."""
    low, high = freeze_range
    if not 0 < low <= high:
        raise ValueError(f"freeze range {low}-{high}s: want 0 < min <= max")
    targets = tuple(t for t in targets if set(actions_on(t)) & set(actions))
    if not targets:
        raise ValueError(f"no target takes any of the actions {', '.join(actions)}")
    rng = random.Random(seed)
    deck: list[str] = []
    faults = []
    for _ in range(rounds):
        if not deck:
            deck = list(targets)
            rng.shuffle(deck)
        target = deck.pop()
        action = rng.choice([a for a in actions_on(target) if a in actions])
        freeze_s = round(rng.uniform(low, high), 1) if action == FREEZE else 0.0
        faults.append(Fault(target, action, freeze_s))
    return faults
