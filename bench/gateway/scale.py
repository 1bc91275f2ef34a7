"""Scale-out figures for `llmgw bench gateway`, measured in the same run as the arms:

workers  one gateway process against two sharing the port with SO_REUSEPORT (what
         `llmgw gateway --workers 2` runs), req/s at concurrency 64 and SSE streams/s at 16,
         same load generator, same stand-in; neither is pinned to a core;
quota    two gateways on one store (SQLite, or PostgreSQL with --quota-store URL), a key
         with a token budget and a key with an rpm limit, requests sent to both as fast as
         they answer: how many were admitted against the limit, and what was spent.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import os
import secrets
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import aiohttp

from bench.gateway.loadgen import build_request, run_load
from bench.gateway.procs import Child, cpu_seconds, http_get, wait_for_file, wait_until
from bench.gateway.target import KEY_FILENAME, MODEL
from engines.local_port import free_port
from gateway.prompt_estimate import estimate_prompt_tokens
from store import KeyLimits, open_store
from store.lease_rules import LeaseChange, PoolRef

HOST = "127.0.0.1"
PATH = "/v1/chat/completions"
START_TIMEOUT_S = 30.0
MESSAGES = [{"role": "user", "content": "Say hi."}]
MAX_TOKENS = 16
# Requests the budget key's limit fits at its reservation (prompt + max_tokens), and how many
# times that many are sent.
BUDGET_REQUESTS = 100
RPM_LIMIT = 200
OVERSEND = 3
CONCURRENCY = 32
# Read at import, before the benchmark pins itself.
ALL_CPUS = os.sched_getaffinity(0)


@dataclass(frozen=True)
class WorkerFigures:
    workers: int
    rps_c64: float
    sse_c16: float
    errors: int
    # At c64, all the workers together: their CPU per answer (µs), the cores they kept busy,
    # and each worker's share of that CPU.
    cpu_us_c64: float | None = None
    cores_c64: float | None = None
    shares_c64: tuple[float, ...] = ()


@dataclass(frozen=True)
class QuotaFigures:
    limit_name: str
    limit: int
    sent: int
    admitted: int
    refused: int
    other: int
    spent_tokens: int | None  # budget keys: the store's count once every gateway reported
    store: str = "SQLite"


def _body(stream: bool) -> dict[str, object]:
    body: dict[str, object] = {"model": MODEL, "messages": MESSAGES, "max_tokens": MAX_TOKENS}
    if stream:
        body["stream"] = True
    return body


def _target(
    name: str,
    port: int,
    upstream: str,
    state_dir: Path,
    workdir: Path,
    key: bool,
    database_url: str = "",
    own_port: int | None = None,
) -> Child:
    argv = [sys.executable, "-m", "bench.gateway.target", "--port", str(port)]
    argv += ["--upstream", upstream, "--state-dir", str(state_dir), "--reuse-port"]
    if own_port is not None:
        argv += ["--own-port", str(own_port)]
    if database_url:
        argv += ["--database-url", database_url]
    if not key:
        argv.append("--no-key")
    child = Child(name, argv, workdir / f"{name}.log", None)
    # Any core: the benchmark itself is pinned, and a child would inherit that.
    os.sched_setaffinity(child.process.pid, ALL_CPUS)
    return child


def _ready(port: int) -> bool:
    try:
        status, body = http_get(port, "/healthz")
    except OSError:
        return False
    return status == 200 and json.loads(body).get("routes_version") == 1


@contextmanager
def _gateways(
    count: int,
    upstream: str,
    state_dir: Path,
    workdir: Path,
    shared_port: bool,
    label: str,
    database_url: str = "",
    pids: list[int] | None = None,
) -> Iterator[list[int]]:
    """`count` gateway processes on one store: on one port (workers) or a port each; their
    process ids appended to `pids`."""
    ports = [free_port()] * count if shared_port else [free_port() for _ in range(count)]
    with ExitStack() as stack:
        for index, port in enumerate(ports):
            # On a shared port any process may answer the readiness check: each also listens on
            # a port of its own, asked instead. (Asked on the shared port, the first worker
            # answered for both, the load's connections all went to it before the second
            # listened, and kept to it: two workers measured the same as one.)
            own = free_port() if shared_port else None
            # The first makes the bench key; the others find it in the store.
            child = _target(
                f"{label}-{index}",
                port,
                upstream,
                state_dir,
                workdir,
                index == 0,
                database_url,
                own,
            )
            stack.callback(child.stop)
            if pids is not None:
                pids.append(child.process.pid)
            if index == 0:
                wait_for_file(state_dir / KEY_FILENAME, child, START_TIMEOUT_S)
            wait_until(child, functools.partial(_ready, own or port), START_TIMEOUT_S)
        yield ports


def measure_workers(
    upstream: str, workdir: Path, runner: asyncio.Runner, duration_s: float, warmup_s: float
) -> list[WorkerFigures]:
    figures = []
    for workers in (1, 2):
        state_dir = workdir / f"workers-{workers}"
        state_dir.mkdir()
        pids: list[int] = []
        with _gateways(
            workers, upstream, state_dir, workdir, True, f"worker{workers}", pids=pids
        ) as ports:
            auth = "Bearer " + (state_dir / KEY_FILENAME).read_text().strip()
            rates = []
            errors = 0
            used: list[float] = []
            wall = answered = 0.0
            for concurrency, stream in ((64, False), (16, True)):
                request = build_request(HOST, ports[0], PATH, _body(stream), auth)
                before, started = [cpu_seconds(pid) for pid in pids], time.perf_counter()
                result = runner.run(
                    run_load(
                        HOST,
                        ports[0],
                        request,
                        concurrency=concurrency,
                        duration_s=duration_s,
                        warmup_s=warmup_s,
                        expect_done=stream,
                    )
                )
                if not stream:
                    wall, answered = time.perf_counter() - started, result.answered
                    used = [cpu_seconds(pid) - b for pid, b in zip(pids, before, strict=True)]
                rates.append(result.rate)
                errors += result.errors
        total = sum(used)
        figures.append(
            WorkerFigures(
                workers,
                rates[0],
                rates[1],
                errors,
                # Over the whole load, warm-up included, per answer in the window: as the
                # arms' figures are (bench/gateway/main.py), so the two compare.
                cpu_us_c64=total / answered * 1e6 if answered else None,
                cores_c64=total / wall if wall else None,
                shares_c64=tuple(u / total for u in used) if total else (),
            )
        )
        print(
            f"  {workers} worker(s): {rates[0]:,.0f} req/s c64, {rates[1]:,.0f} SSE/s c16"
            + (f", {errors} errors" if errors else ""),
            file=sys.stderr,
        )
    return figures


async def _fire(ports: list[int], authorization: str, count: int) -> tuple[int, int, int]:
    """Send `count` requests, alternating between the gateways, CONCURRENCY at a time:
    (admitted, refused with 429, anything else)."""
    statuses: list[int] = []
    gateways = itertools.cycle(ports)
    pending = iter(range(count))
    headers = {"Authorization": authorization}
    async with aiohttp.ClientSession() as session:

        async def one_after_another() -> None:
            for _ in pending:
                url = f"http://{HOST}:{next(gateways)}{PATH}"
                async with session.post(url, json=_body(False), headers=headers) as response:
                    await response.read()
                    statuses.append(response.status)

        await asyncio.gather(*(one_after_another() for _ in range(CONCURRENCY)))
    admitted, refused = statuses.count(200), statuses.count(429)
    return admitted, refused, len(statuses) - admitted - refused


async def _make_keys(state_dir: Path, database_url: str) -> dict[str, tuple[str, str, int]]:
    """The keys the quota scenario spends: name -> (key_id, plaintext, limit)."""
    budget = BUDGET_REQUESTS * (estimate_prompt_tokens(_body(False)) + MAX_TOKENS)
    store = open_store(database_url or None, state_dir)
    await store.init()
    try:
        made = {}
        for name, limits, limit in (
            ("budget", KeyLimits(token_budget=budget), budget),
            ("rpm", KeyLimits(rpm=RPM_LIMIT), RPM_LIMIT),
        ):
            # A name of this run's own: a PostgreSQL store outlives the work directory.
            key_name = f"quota-{name}-{secrets.token_hex(4)}"
            record, plaintext = await store.create_key(key_name, limits=limits)
            made[name] = (record.key_id, plaintext, limit)
        return made
    finally:
        await store.close()


async def _spent(state_dir: Path, database_url: str, key_id: str) -> int:
    """The budget pool's spend once both gateways reported theirs (a few rounds)."""
    store = open_store(database_url or None, state_dir)
    await store.init()
    try:
        period = datetime.now(UTC).date().isoformat()
        pool = PoolRef(key_id, "budget", period)
        last = -1
        for _ in range(20):
            (state,) = await store.sync_leases("bench-observer", 60, [LeaseChange(pool)])
            if state.spent == last:
                return state.spent
            last = state.spent
            await asyncio.sleep(0.5)
        return last
    finally:
        await store.close()


def measure_quota(
    upstream: str, workdir: Path, runner: asyncio.Runner, database_url: str = ""
) -> list[QuotaFigures]:
    state_dir = workdir / "quota"
    state_dir.mkdir()
    keys = runner.run(_make_keys(state_dir, database_url))
    figures = []
    with _gateways(2, upstream, state_dir, workdir, False, "quota", database_url) as ports:
        for name, (key_id, plaintext, limit) in keys.items():
            sent = OVERSEND * (BUDGET_REQUESTS if name == "budget" else RPM_LIMIT)
            started = time.monotonic()
            admitted, refused, other = runner.run(_fire(ports, f"Bearer {plaintext}", sent))
            took = time.monotonic() - started
            spent = (
                runner.run(_spent(state_dir, database_url, key_id)) if name == "budget" else None
            )
            store = "PostgreSQL" if database_url else "SQLite"
            figures.append(QuotaFigures(name, limit, sent, admitted, refused, other, spent, store))
            print(
                f"  {name}: limit {limit:,}, sent {sent} in {took:.1f} s, admitted {admitted}, "
                f"refused {refused}" + ("" if spent is None else f", spent {spent:,} tokens"),
                file=sys.stderr,
            )
    return figures


def lines(workers: list[WorkerFigures], quota: list[QuotaFigures]) -> list[str]:
    out = []
    if len(workers) == 2 and workers[0].rps_c64 > 0 and workers[0].sse_c16 > 0:
        one, two = workers
        out.append(
            f"workers: 1 -> 2 gives {one.rps_c64:,.0f} -> {two.rps_c64:,.0f} req/s c64 "
            f"(x{two.rps_c64 / one.rps_c64:.2f}) and {one.sse_c16:,.0f} -> {two.sse_c16:,.0f} "
            f"SSE streams/s c16 (x{two.sse_c16 / one.sse_c16:.2f})"
        )
        if one.cpu_us_c64 and two.cpu_us_c64 and one.cores_c64 and two.cores_c64:
            # What the throughput cannot show on a machine whose cores the load generator and
            # the stand-in share: whether a request costs two workers more CPU than one.
            split = "/".join(f"{share:.0%}" for share in two.shares_c64)
            out.append(
                f"workers' CPU per request c64: {one.cpu_us_c64:,.0f} -> {two.cpu_us_c64:,.0f} "
                f"us (x{two.cpu_us_c64 / one.cpu_us_c64:.2f}; split {split}); cores kept busy "
                f"{one.cores_c64:.2f} -> {two.cores_c64:.2f} of {len(ALL_CPUS)}"
            )
    for q in quota:
        if q.limit_name == "budget":
            spent = q.spent_tokens or 0
            verdict = "within" if spent <= q.limit else "OVER"
            out.append(
                f"quota, two gateways on one {q.store} store: budget of {q.limit:,} tokens (fits "
                f"{BUDGET_REQUESTS} requests at their reservation, more at what they use): "
                f"{q.admitted} of {q.sent} admitted, {spent:,} tokens spent = "
                f"{spent / q.limit:.0%} of the budget ({verdict} it)"
            )
        else:
            out.append(
                f"quota, two gateways on one {q.store} store: rpm {q.limit}: {q.admitted} of "
                f"{q.sent} admitted within the minute ({q.admitted / q.limit:.0%} of the limit)"
            )
        if q.other:
            out.append(f"  {q.other} {q.limit_name} requests got neither 200 nor 429")
    return out
