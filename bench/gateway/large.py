"""Large prompts: what a proxy spends per byte of a 200 KB request, and whether small requests
beside them wait.

An agent's context makes a chat body of hundreds of kilobytes. Two shapes, 200 KB each, of
varied words (not one repeated character, which would flatter any scan):

  one string   one user message holding the whole 200 KB;
  transcript   a system prompt and 99 alternating user and assistant turns, 2 KB each.

Per arm (direct as the reference, then the hop and llmgw): first a stream of small chat
requests alone at concurrency 1 (their p50/p99 and the proxy's CPU per small request); then per
shape the large bodies alone at concurrency LARGE_CONCURRENCY (the proxy's CPU from /proc over
the window, divided by the megabytes answered: its CPU per MB of prompt), and the large bodies
again, paced (BESIDE_PAUSE_S between requests on each connection), with the small stream beside
them (the small requests' p50/p99 there). llmgw's CPU per MB as a multiple of the hop's is
the figure the gateway is held to (at most GOAL_CPU_PER_BYTE); the same less what a small
request costs each proxy is printed beside it: the bytes' own cost, without what every request
costs. Measured here arm after arm, minutes apart, that ratio moves with the machine; the goal
is judged in the paired rounds (bench/gateway/paired.py), which load the same two bodies
through the hop and llmgw in turn and together.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from dataclasses import dataclass, field

from bench.gateway.loadgen import LoadResult, build_request, run_load
from bench.gateway.procs import cpu_seconds
from bench.gateway.stats import ms, percentile, ratio

ARMS = ("direct", "hop", "llmgw")
PROMPT_BYTES = 200 * 1024
TURNS = 100
LARGE_CONCURRENCY = 4
# Beside the small requests, each large connection pauses this long after an answer: a load
# every arm can take (about 150 large requests a second), so the small requests' latency shows
# what a large body in flight does to them, not a saturated core's queue.
BESIDE_PAUSE_S = 0.02
SMALL_CONCURRENCY = 1
GOAL_CPU_PER_BYTE = 1.5
# Common English words, some followed by punctuation, drawn with a fixed seed: every run and
# every arm sends the very same bytes.
_WORD_LIST = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there been one all we their has would when if so out no "
    "more what up into who them some could other time model request token cache prompt agent "
    "context function result error value return file line test build before after because"
)
_WORDS = _WORD_LIST.split()
_SEED = 35


def words(size: int, rng: random.Random) -> str:
    out: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(_WORDS)
        draw = rng.random()
        if draw < 0.08:
            word += ","
        elif draw < 0.12:
            word += "."
        elif draw < 0.13:
            word += '"\n'  # escapes in the JSON: a quote and a newline
        out.append(word)
        length += len(word) + 1
    return " ".join(out)[:size]


def shapes(model: str) -> dict[str, dict[str, object]]:
    """Each shape's chat body, by name."""
    rng = random.Random(_SEED)
    turn = PROMPT_BYTES // TURNS
    transcript = [{"role": "system", "content": words(turn, rng)}]
    transcript += [
        {"role": "user" if i % 2 else "assistant", "content": words(turn, rng)}
        for i in range(1, TURNS)
    ]
    return {
        "one string": {
            "model": model,
            "messages": [{"role": "user", "content": words(PROMPT_BYTES, rng)}],
            "max_tokens": 16,
        },
        "transcript": {"model": model, "messages": transcript, "max_tokens": 16},
    }


@dataclass
class ShapeFigures:
    shape: str
    body_bytes: int
    large_rps: float | None = None
    # The large requests a second beside the small ones (paced: BESIDE_PAUSE_S).
    paced_rps: float | None = None
    # The proxy's CPU seconds per MB (10^6 bytes) of large bodies answered, with no small
    # requests beside them; and the same less what a small request costs it (what the bytes
    # cost, without what every request costs).
    proxy_cpu_s_per_mb: float | None = None
    proxy_added_s_per_mb: float | None = None
    small_p50_ms: float | None = None
    small_p99_ms: float | None = None


@dataclass
class LargeFigures:
    name: str
    small_p50_ms: float | None = None
    small_p99_ms: float | None = None
    shapes: list[ShapeFigures] = field(default_factory=list)
    errors: int = 0
    first_error: str | None = None


async def _loads(
    host: str,
    port: int,
    requests: list[tuple[bytes, int, float]],
    duration_s: float,
    warmup_s: float,
) -> list[LoadResult]:
    """Each (request, concurrency, pause) in its own closed loop, all at once."""
    return list(
        await asyncio.gather(
            *(
                run_load(
                    host,
                    port,
                    request,
                    concurrency=concurrency,
                    duration_s=duration_s,
                    warmup_s=warmup_s,
                    pause_s=pause_s,
                )
                for request, concurrency, pause_s in requests
            )
        )
    )


@dataclass(frozen=True)
class Target:
    """Where to send, and the process whose CPU is the proxy's (None: direct)."""

    host: str
    port: int
    path: str
    authorization: str
    pid: int | None


def measure(
    name: str,
    runner: asyncio.Runner,
    target: Target,
    small_body: dict[str, object],
    model: str,
    duration_s: float,
    warmup_s: float,
) -> LargeFigures:
    figures = LargeFigures(name)
    host, port, path, pid = target.host, target.port, target.path, target.pid
    authorization = target.authorization
    small = build_request(host, port, path, small_body, authorization)

    def window(*requests: tuple[bytes, int, float]) -> tuple[list[LoadResult], float | None]:
        before = cpu_seconds(pid) if pid else 0.0
        results = runner.run(_loads(host, port, list(requests), duration_s, warmup_s))
        used = cpu_seconds(pid) - before if pid else None
        for result in results:
            figures.errors += result.errors
            figures.first_error = figures.first_error or result.first_error
        return results, used

    (alone,), used = window((small, SMALL_CONCURRENCY, 0.0))
    small_cpu = used / alone.answered if used is not None and alone.answered else None
    figures.small_p50_ms = ms(percentile(alone.latencies_s, 50))
    figures.small_p99_ms = ms(percentile(alone.latencies_s, 99))
    print(
        f"  {name:<8} small c{SMALL_CONCURRENCY} alone  p50 {figures.small_p50_ms:7.3f} ms  "
        f"p99 {figures.small_p99_ms:7.3f} ms",
        file=sys.stderr,
    )
    for shape, body in shapes(model).items():
        large = build_request(host, port, path, body, authorization)
        size = len(json.dumps(body, separators=(",", ":")).encode())
        (big,), used = window((large, LARGE_CONCURRENCY, 0.0))
        (beside, paced), _ = window(
            (small, SMALL_CONCURRENCY, 0.0), (large, LARGE_CONCURRENCY, BESIDE_PAUSE_S)
        )
        shaped = ShapeFigures(
            shape,
            size,
            large_rps=big.rate,
            paced_rps=paced.rate,
            small_p50_ms=ms(percentile(beside.latencies_s, 50)),
            small_p99_ms=ms(percentile(beside.latencies_s, 99)),
        )
        if used is not None and big.answered:
            each = used / big.answered
            shaped.proxy_cpu_s_per_mb = each / (size / 1e6)
            if small_cpu is not None:
                shaped.proxy_added_s_per_mb = (each - small_cpu) / (size / 1e6)
        figures.shapes.append(shaped)
        cpu = shaped.proxy_cpu_s_per_mb
        print(
            f"  {name:<8} {shape:<11} c{LARGE_CONCURRENCY} {big.rate:7,.0f} req/s"
            + ("" if cpu is None else f"  proxy CPU {cpu * 1e3:6.1f} ms/MB")
            + f"  small beside: p50 {shaped.small_p50_ms:7.3f} ms  "
            f"p99 {shaped.small_p99_ms:7.3f} ms",
            file=sys.stderr,
        )
    return figures


def _f(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


COLUMNS = (
    "arm",
    "shape",
    "large req/s",
    "paced req/s",
    "proxy CPU ms/MB",
    "less small's",
    "small p50 alone",
    "small p99 alone",
    "p50 beside",
    "p99 beside",
)


def _per_mb_ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def rows(arms: list[LargeFigures]) -> list[list[str]]:
    out = []
    for arm in arms:
        for shape in arm.shapes:
            out.append(
                [
                    arm.name,
                    shape.shape,
                    _f(shape.large_rps, 0),
                    _f(shape.paced_rps, 0),
                    _f(_per_mb_ms(shape.proxy_cpu_s_per_mb), 1),
                    _f(_per_mb_ms(shape.proxy_added_s_per_mb), 1),
                    _f(arm.small_p50_ms),
                    _f(arm.small_p99_ms),
                    _f(shape.small_p50_ms),
                    _f(shape.small_p99_ms),
                ]
            )
    return out


def cpu_ratios(arms: list[LargeFigures], added: bool = False) -> dict[str, float | None]:
    """llmgw's CPU per byte as a multiple of the hop's, per shape; with `added`, less what a
    small request costs each."""
    by = {a.name: a for a in arms}
    llmgw, hop = by.get("llmgw"), by.get("hop")
    if llmgw is None or hop is None:
        return {}

    def per_mb(shape: ShapeFigures) -> float | None:
        return shape.proxy_added_s_per_mb if added else shape.proxy_cpu_s_per_mb

    hops = {s.shape: per_mb(s) for s in hop.shapes}
    return {s.shape: ratio(per_mb(s), hops.get(s.shape)) for s in llmgw.shapes}


def lines(arms: list[LargeFigures]) -> list[str]:
    """The table, then llmgw's CPU per byte against the hop's, as plain text."""
    if not arms:
        return []
    body = rows(arms)
    widths = [max(len(c), *(len(r[i]) for r in body)) for i, c in enumerate(COLUMNS)]
    table = [
        "  ".join(
            f"{c:<{w}}" if i < 2 else f"{c:>{w}}"
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )
        for cells in (COLUMNS, *body)
    ]
    out = [
        f"large prompts ({PROMPT_BYTES // 1024} KB bodies at c{LARGE_CONCURRENCY}; beside small "
        f"requests at c{SMALL_CONCURRENCY}, each large connection pausing "
        f"{BESIDE_PAUSE_S * 1e3:g} ms between requests; latencies in ms):",
        *table,
    ]
    added = cpu_ratios(arms, added=True)
    for shape, times in cpu_ratios(arms).items():
        # Measured minutes apart, the ratio moves with the machine: the paired rounds
        # (bench/gateway/paired.py) give the verdict on the goal.
        out.append(
            f"llmgw proxy CPU per byte, the hop's measured apart ({shape}): {_x(times)} "
            f"(less a small request's CPU: {_x(added.get(shape))}; goal {GOAL_CPU_PER_BYTE}x, "
            "judged in the paired rounds)"
        )
    for arm in arms:
        if arm.errors or arm.first_error:
            out.append(f"{arm.name} (large): {arm.errors} failed; first: {arm.first_error}")
    return out


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def markdown(arms: list[LargeFigures]) -> str:
    if not arms:
        return ""
    parts = [
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join([":---", ":---", *("---:" for _ in COLUMNS[2:])]) + "|",
        *("| " + " | ".join(r) + " |" for r in rows(arms)),
        "",
    ]
    for line in lines(arms)[len(rows(arms)) + 2 :]:
        parts.append(f"- {line}")
    return "\n".join(parts) + "\n"
