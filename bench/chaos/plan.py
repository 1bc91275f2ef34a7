"""Which process each round hits, and how: a seeded plan, so a run can be repeated exactly.

Targets are dealt like cards: every target once, in random order, before any repeats. Pure
random draws would often leave a process untouched in a short run (five rounds over five
targets miss at least one about 96% of the time), and a campaign that never froze Temporal
says nothing about the fault the whole issue started from."""

import random
from dataclasses import dataclass

TARGETS = ("agent", "control", "temporal", "gateway", "engine")
KILL, FREEZE = "kill", "freeze"


@dataclass(frozen=True)
class Fault:
    target: str
    action: str  # KILL or FREEZE
    freeze_s: float = 0.0  # how long the process stays stopped (FREEZE only)

    def describe(self) -> str:
        if self.action == FREEZE:
            return f"freeze {self.target} {self.freeze_s:.0f}s"
        return f"kill {self.target}"


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
    actions: tuple[str, ...] = (KILL, FREEZE),
) -> list[Fault]:
    low, high = freeze_range
    if not 0 < low <= high:
        raise ValueError(f"freeze range {low}-{high}s: want 0 < min <= max")
    rng = random.Random(seed)
    deck: list[str] = []
    faults = []
    for _ in range(rounds):
        if not deck:
            deck = list(targets)
            rng.shuffle(deck)
        target = deck.pop()
        action = rng.choice(actions)
        freeze_s = round(rng.uniform(low, high), 1) if action == FREEZE else 0.0
        faults.append(Fault(target, action, freeze_s))
    return faults
