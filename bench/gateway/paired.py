"""llmgw's CPU per request against the bare hop's, in paired rounds.

On a shared VM the hop's own CPU per request moves by a third from one run to the next, more
than a day's changes to the gateway; measured once each, minutes apart, the ratio of the two
moves with it. Here both proxies are up at once on the proxy core, and each load is measured
two ways, five rounds each:
- in turn: the hop and llmgw loaded back to back, hop first in even rounds and llmgw first in
  odd ones, so a drift of the machine over the run falls on both alike;
- together: both loaded at once over the same seconds (each with the load's connections), so
  whatever the machine does in those seconds (another guest's burst, a slower clock) falls on
  both: they share the core, each its CPU per answer measured over the same window.
Each round gives a ratio; the figure is their median, printed with the lowest and highest.

The loads: plain requests at c64 and streams at c16 (goal: at most 1.3x the hop's CPU per
answer), and the large-prompt benchmark's two 200 KB bodies at c4 (bench/gateway/large.py;
goal: at most 1.5x the hop's CPU per byte, which for the same bodies is the ratio per answer).

Per arm and round: a short warm-up load, then a closed loop of `duration_s` (the benchmark's
--duration, 5 s by default); the proxy's CPU (user + system, from /proc) over that loop,
divided by the answers it counted.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bench.gateway.large import GOAL_CPU_PER_BYTE, LARGE_CONCURRENCY, Target, shapes
from bench.gateway.loadgen import LoadResult, build_request, run_load
from bench.gateway.procs import cpu_seconds

ARMS = ("hop", "llmgw")
ROUNDS = 5
WARMUP_S = 0.5
GOAL_CPU_RATIO = 1.3
MODES = ("in turn", "together")


@dataclass(frozen=True)
class Load:
    name: str
    concurrency: int
    stream: bool
    goal: float  # llmgw's CPU per answer at most this multiple of the hop's
    shape: str | None = None  # a large body (large.shapes) rather than the benchmark's small one


LOADS = (
    Load("plain c64", 64, False, GOAL_CPU_RATIO),
    Load("SSE c16", 16, True, GOAL_CPU_RATIO),
    *(
        Load(
            f"200 KB {shape} c{LARGE_CONCURRENCY}",
            LARGE_CONCURRENCY,
            False,
            GOAL_CPU_PER_BYTE,
            shape,
        )
        for shape in ("one string", "transcript")
    ),
)


@dataclass
class PairedFigures:
    load: str
    # Microseconds of proxy CPU per answer, one per round.
    hop_us: list[float] = field(default_factory=list)
    llmgw_us: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str | None = None
    goal: float = GOAL_CPU_RATIO

    @property
    def ratios(self) -> list[float]:
        return [mine / hop for mine, hop in zip(self.llmgw_us, self.hop_us, strict=True) if hop]


def _progress(line: str) -> None:
    print(line, file=sys.stderr)


def order(round_number: int) -> tuple[str, ...]:
    """The arms in the order round `round_number` (from 0) loads them: hop first, then llmgw
    first, in turn."""
    return ARMS if round_number % 2 == 0 else ARMS[::-1]


async def _cpu_per_answer(
    target: Target, request: bytes, concurrency: int, stream: bool, duration_s: float
) -> tuple[float | None, int, str | None]:
    """(µs of CPU per answer or None, errors, the first error) of one closed loop."""

    async def load(seconds: float) -> LoadResult:
        return await run_load(
            target.host,
            target.port,
            request,
            concurrency=concurrency,
            duration_s=seconds,
            warmup_s=0.0,
            expect_done=stream,
        )

    assert target.pid is not None  # both arms are proxies of their own
    await load(WARMUP_S)
    before = cpu_seconds(target.pid)
    result = await load(duration_s)
    used = cpu_seconds(target.pid) - before
    each = used / result.answered * 1e6 if result.answered else None
    return each, result.errors, result.first_error


async def _together(
    targets: dict[str, Target],
    requests: dict[str, bytes],
    concurrency: int,
    stream: bool,
    duration_s: float,
) -> dict[str, tuple[float | None, int, str | None]]:
    """Both arms loaded at once: each one's (µs per answer, errors, first error)."""
    results = await asyncio.gather(
        *(
            _cpu_per_answer(targets[arm], requests[arm], concurrency, stream, duration_s)
            for arm in ARMS
        )
    )
    return dict(zip(ARMS, results, strict=True))


def measure(
    runner: asyncio.Runner,
    targets: dict[str, Target],
    body_of: Callable[[bool], dict[str, object]],
    model: str,
    rounds: int,
    duration_s: float,
) -> list[PairedFigures]:
    """Every load of LOADS, in turn then together; `body_of(stream)` gives the small body."""
    large_bodies = shapes(model)

    def requests(load: Load) -> dict[str, bytes]:
        body = body_of(load.stream) if load.shape is None else large_bodies[load.shape]
        return {
            arm: build_request(t.host, t.port, t.path, body, t.authorization)
            for arm, t in targets.items()
        }

    built = {load: requests(load) for load in LOADS}
    return [
        _rounds(runner, load, mode, targets, built[load], rounds, duration_s)
        for mode in MODES
        for load in LOADS
    ]


def _rounds(
    runner: asyncio.Runner,
    load: Load,
    mode: str,
    targets: dict[str, Target],
    requests: dict[str, bytes],
    rounds: int,
    duration_s: float,
) -> PairedFigures:
    name, together = f"{load.name} {mode}", mode == "together"
    concurrency, stream = load.concurrency, load.stream
    paired = PairedFigures(name, goal=load.goal)
    for n in range(rounds):
        if together:
            results = runner.run(_together(targets, requests, concurrency, stream, duration_s))
        else:
            results = {
                arm: runner.run(
                    _cpu_per_answer(targets[arm], requests[arm], concurrency, stream, duration_s)
                )
                for arm in order(n)
            }
        got: dict[str, float | None] = {}
        for arm, (each, errors, first) in results.items():
            got[arm] = each
            paired.errors += errors
            paired.first_error = paired.first_error or first
        hop, mine = got["hop"], got["llmgw"]
        if hop is not None and mine is not None:
            paired.hop_us.append(hop)
            paired.llmgw_us.append(mine)
            _progress(
                f"  {name} round {n + 1}: hop {hop:4.0f} us, llmgw {mine:4.0f} us, "
                f"{mine / hop:.2f}x"
            )
    return paired


def lines(figures: Sequence[PairedFigures]) -> list[str]:
    """Each load's median ratio, its range and the arms' medians; then the goal's verdict."""
    out = []
    for f in figures:
        ratios = f.ratios
        if not ratios:
            out.append(
                f"n/a   llmgw CPU per request <= {f.goal}x hop's ({f.load}): no round measured"
            )
            continue
        median = statistics.median(ratios)
        mark = "PASS" if median <= f.goal else "MISS"
        out.append(
            f"{mark}  llmgw CPU per request <= {f.goal}x hop's ({f.load}, median of "
            f"{len(ratios)} paired rounds): {median:.2f}x (rounds {min(ratios):.2f}x to "
            f"{max(ratios):.2f}x; llmgw {statistics.median(f.llmgw_us):.0f} us, hop "
            f"{statistics.median(f.hop_us):.0f} us)"
        )
        if f.errors or f.first_error:
            out.append(f"paired {f.load}: {f.errors} failed; first: {f.first_error}")
    return out
