"""Signalling the process a round picked: SIGKILL, or SIGSTOP and later SIGCONT. Every frozen
process is resumed on the way out, whatever happened, so a campaign never leaves one stopped."""

import contextlib
import os
import random
import signal
from dataclasses import dataclass, field
from pathlib import Path

from bench.chaos.checks import AgentShard, EngineProcess


class NoVictim(RuntimeError):
    pass


def pick_engine(
    shards: dict[str, AgentShard], engines: list[EngineProcess], rng: random.Random
) -> AgentShard:
    """A random replica whose spec names a live engine."""
    live = {e.identity for e in engines}
    candidates = [s for _, s in sorted(shards.items()) if s.identity in live]
    if not candidates:
        raise NoVictim("no live engine to hit")
    return rng.choice(candidates)


def child_pid(state_dir: Path, name: str) -> int:
    """The pid `llmgw up` wrote for one of its processes (temporal, control, agent, gateway)."""
    try:
        return int((state_dir / "run" / f"{name}.pid").read_text())
    except (OSError, ValueError) as err:
        raise NoVictim(f"no pid for {name}: {err}") from None


@dataclass
class Signaller:
    frozen: set[int] = field(default_factory=set)

    def kill(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)

    def freeze(self, pid: int) -> None:
        self.frozen.add(pid)
        os.kill(pid, signal.SIGSTOP)

    def resume(self, pid: int) -> None:
        self.frozen.discard(pid)
        # It may have died while frozen (`up` stopping everything): nothing to resume then.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)

    def resume_all(self) -> None:
        for pid in sorted(self.frozen):
            self.resume(pid)
