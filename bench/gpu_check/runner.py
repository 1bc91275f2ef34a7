"""The GPU check's steps: each runs under its own timeout, inside what is left of the whole
check's budget; a step that fails or times out is recorded and the next runs; a step whose
prerequisite did not pass is skipped with the reason. The table and the exit status are pure.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum


class Outcome(StrEnum):
    PASS = "PASS"  # noqa: S105 - a step's outcome, not a password
    FAIL = "FAIL"
    SKIP = "SKIP"


class Skip(Exception):
    """Raised by a step that cannot run here (no NVIDIA GPU): SKIP with this reason."""


class Failed(Exception):
    """Raised by a step whose check did not hold: FAIL with this detail (no traceback)."""


@dataclass(frozen=True)
class Step:
    """One check. `run` returns the detail of a pass; it raises Skip or Failed to say
    otherwise (any other exception is a FAIL with its type and message). `needs`: the steps
    that must have passed first."""

    name: str
    run: Callable[[], Awaitable[str]]
    timeout_s: float
    needs: tuple[str, ...] = ()


@dataclass(frozen=True)
class StepResult:
    name: str
    outcome: Outcome
    seconds: float
    detail: str


@dataclass
class Budget:
    """The whole check's time: each step gets the lesser of its own timeout and what is left."""

    total_s: float
    clock: Callable[[], float] = time.monotonic
    started: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def left(self) -> float:
        return max(0.0, self.total_s - (self.clock() - self.started))


def _unmet(step: Step, done: dict[str, StepResult]) -> str:
    """Why `step` cannot run ("" when it can): the first prerequisite that did not pass."""
    for need in step.needs:
        result = done.get(need)
        if result is None:
            return f"needs {need}, which did not run"
        if result.outcome is Outcome.FAIL:
            return f"needs {need}, which failed"
        if result.outcome is Outcome.SKIP:
            return result.detail  # the same reason: "no NVIDIA GPU", not a chain of "needs"
    return ""


async def _guarded(step: Step) -> str:
    """The step, with the SystemExit the bench helpers stop with ("vllm is not usable: ...")
    turned into a failure inside its own task: asyncio would otherwise carry it out of the
    event loop and end the whole check."""
    try:
        return await step.run()
    except SystemExit as err:
        raise Failed(str(err.code)) from err


async def run_step(step: Step, budget: Budget) -> StepResult:
    began = time.monotonic()
    allowed = min(step.timeout_s, budget.left())

    def result(outcome: Outcome, detail: str) -> StepResult:
        return StepResult(step.name, outcome, time.monotonic() - began, detail)

    if allowed <= 0:
        return result(Outcome.FAIL, "no time left in the check's budget")
    try:
        detail = await asyncio.wait_for(_guarded(step), allowed)
    except TimeoutError:
        limit = "its timeout" if allowed == step.timeout_s else "the check's budget"
        return result(Outcome.FAIL, f"timed out after {allowed:.0f}s ({limit})")
    except Skip as why:
        return result(Outcome.SKIP, str(why))
    except Failed as why:
        return result(Outcome.FAIL, str(why))
    except Exception as err:  # noqa: BLE001 - a step's bug or a tool's failure is its FAIL
        return result(Outcome.FAIL, f"{type(err).__name__}: {err}")
    return result(Outcome.PASS, detail)


async def run_steps(
    steps: Sequence[Step],
    budget: Budget,
    on_result: Callable[[StepResult], None] = lambda _r: None,
) -> list[StepResult]:
    """Every step in order; each result handed to `on_result` as it is known."""
    done: dict[str, StepResult] = {}
    for step in steps:
        unmet = _unmet(step, done)
        found = (
            StepResult(step.name, Outcome.SKIP, 0.0, unmet)
            if unmet
            else await run_step(step, budget)
        )
        done[step.name] = found
        on_result(found)
    return list(done.values())


def exit_status(results: Sequence[StepResult]) -> int:
    """1 when any step failed; skips are not failures (a CPU machine skips the GPU steps)."""
    return 1 if any(r.outcome is Outcome.FAIL for r in results) else 0


def table(results: Sequence[StepResult], detail_width: int = 100) -> str:
    """step | result | seconds | detail, one line per step (the detail cut to its width)."""
    name_width = max([len("step"), *(len(r.name) for r in results)])
    lines = [f"{'step':<{name_width}}  result  seconds  detail"]
    for r in results:
        detail = " ".join(r.detail.split())
        if len(detail) > detail_width:
            detail = detail[: detail_width - 3] + "..."
        lines.append(f"{r.name:<{name_width}}  {r.outcome.value:<6}  {r.seconds:7.1f}  {detail}")
    counts = {o: sum(1 for r in results if r.outcome is o) for o in Outcome}
    lines.append(", ".join(f"{counts[o]} {o.value.lower()}" for o in Outcome))
    return "\n".join(lines)
