"""Running the routing benchmark's arms on real engines: each request streamed and timed to its
first token (`time_to_first_token`), a workload sent a few requests in flight through a gateway
(`via`) or straight to the engines (`direct`) with the engines' prompt counters read around it
(`run_arm`), and every arm run on freshly started engines, in rounds, for each setting and
workload (`run_bench`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from bench.intervals import WorkloadSums
from bench.routing_engines import Engine, engines, prompt_counters
from bench.routing_gateway import gateway
from bench.routing_report import ArmResult, describe
from bench.routing_workload import (
    SETTINGS,
    BenchConfig,
    BenchRequest,
    gateway_routing,
    pinning_sessions,
    workload,
)
from gateway.settings import GatewaySettings
from store import open_store
from workflows.contracts import Profile
from workflows.engine_keys import engine_key_from_master

MODEL = "smollm2-bench"
NODE = "bench-node"
# The gateway's engine scrape period (its default `engine_scrape_interval_s`).
SCRAPE_INTERVAL_S = GatewaySettings().engine_scrape_interval_s


@dataclass(frozen=True)
class Destination:
    """Where one request goes: a URL, the key to send, and a session to name (or none)."""

    url: str
    key: str
    session: str | None = None


async def time_to_first_token(
    client: httpx.AsyncClient, to: Destination, request: BenchRequest, max_tokens: int
) -> float:
    body = {
        "model": MODEL,
        "messages": request.messages,
        "max_tokens": max_tokens,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {to.key}"}
    if to.session is not None:
        headers["X-Session-Id"] = to.session
    url = to.url
    started = time.perf_counter()
    async with client.stream("POST", url, json=body, headers=headers) as response:
        if response.status_code != 200:
            await response.aread()
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
        first: float | None = None
        async for line in response.aiter_lines():
            if first is not None or not line.startswith("data:") or line == "data: [DONE]":
                continue  # read to the end: the engine frees its slot when the stream ends
            choices = json.loads(line[5:]).get("choices") or []
            # The first chunk carries only the role (content null): the first token is the
            # first content, or the end when the model stopped at once.
            if choices and (
                (choices[0].get("delta") or {}).get("content") is not None
                or choices[0].get("finish_reason")
            ):
                first = time.perf_counter() - started
    if first is not None:
        return first
    raise RuntimeError("the stream ended without a token")


Target = Callable[[int, BenchRequest], Destination]


async def run_arm(
    cfg: BenchConfig,
    result: ArmResult,
    workload_seed: int,
    requests: Sequence[BenchRequest],
    engine_list: Sequence[Engine],
    target: Target,
) -> list[tuple[float, float]]:
    """Send the workload of seed `workload_seed` with `in_flight` requests at a time, in order;
    `target` says where request i goes. Returns each engine's (cached, computed) prompt tokens
    in the run."""
    gate = asyncio.Semaphore(cfg.in_flight)
    # No keep-alive: llama-server closes idle connections, and a request that lands on one as
    # it closes fails before a byte; a new connection per request costs ~0.1 ms on loopback.
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=300.0, trust_env=False, limits=limits) as client:
        warm = BenchRequest(-1, [{"role": "user", "content": "Say hi."}])
        for engine in engine_list:  # first-request costs stay out of the figures
            await time_to_first_token(client, chat_at(engine.url, engine.key), warm, 2)
        # The gateway scrapes the engines' load gauges every second; one taken during a warm-up
        # would show an engine busy at the arm's start, and the least-load choice of each
        # group's first request would avoid it (the oracle's sessions do not look).
        await asyncio.sleep(2 * SCRAPE_INTERVAL_S)
        before = await prompt_counters(client, engine_list)

        ttfts: list[float] = []

        async def one(index: int, request: BenchRequest) -> None:
            try:
                ttfts.append(
                    await time_to_first_token(
                        client, target(index, request), request, cfg.max_tokens
                    )
                )
            except (httpx.HTTPError, RuntimeError) as exc:
                result.errors += 1
                print(f"  request {index} failed: {exc}", file=sys.stderr)
            finally:
                gate.release()

        tasks = []
        for index, request in enumerate(requests):
            await gate.acquire()
            tasks.append(asyncio.create_task(one(index, request)))
        await asyncio.gather(*tasks)
        after = await prompt_counters(client, engine_list)
    split = [(a[0] - b[0], a[1] - b[1]) for a, b in zip(after, before, strict=True)]
    cached, computed = sum(c for c, _ in split), sum(c for _, c in split)
    result.ttft_s += ttfts
    result.cached += cached
    result.computed += computed
    result.by_workload[workload_seed] = WorkloadSums(
        sum(ttfts), len(ttfts), cached, cached + computed
    )
    return split


async def run_bench(cfg: BenchConfig) -> list[ArmResult]:
    # Each repeat its own workload (seeds seed, seed + 1, ...): which two groups end up sharing
    # a replica, and whether their requests collide there, is decided by a workload's order,
    # for the oracle's fixed pinning as for the router's choices. Repeating one order would
    # repeat one draw of that luck rather than average it.
    workloads = [workload(replace(cfg, seed=cfg.seed + n)) for n in range(cfg.repeats)]
    results: list[ArmResult] = []
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-routing-") as tmp:
        state = Path(tmp)
        # The engines' keys come from the store's master secret, as the gateway derives them.
        store = open_store(None, state)
        await store.init()
        try:
            master = await store.master_secret()
        finally:
            await store.close()
        replica_ids = [f"bench-{i}" for i in range(cfg.replicas)]
        keys = [engine_key_from_master(master, NODE, replica_id) for replica_id in replica_ids]
        sessions = pinning_sessions(cfg.groups, replica_ids)
        by_arm: dict[tuple[str, str], ArmResult] = {}
        # Rounds of every arm in turn rather than each arm's repeats together, so that a slow
        # spell of this shared machine lands on all arms alike; each round starts one arm
        # further along, so that no arm always runs first or after the same one.
        arms = cfg.arms
        rounds = [
            (s, SETTINGS[s], n, a)
            for s in cfg.settings
            for n in range(cfg.repeats)
            for a in arms[n % len(arms) :] + arms[: n % len(arms)]
        ]
        for setting, extra, repeat, arm in rounds:
            requests, seed = workloads[repeat], cfg.seed + repeat
            if (setting, arm) not in by_arm:
                by_arm[(setting, arm)] = ArmResult(setting, arm)
                results.append(by_arm[(setting, arm)])
            result = by_arm[(setting, arm)]
            began = time.monotonic()
            async with engines(cfg, keys, extra, state) as engine_list:
                routing = gateway_routing(cfg, arm)
                if routing is None:
                    split = await run_arm(
                        cfg, result, seed, requests, engine_list, direct(engine_list)
                    )
                else:
                    # As the ledger's route says of a llama.cpp profile with these flags.
                    slots = Profile(parallel=cfg.parallel, args=list(extra)).prompt_slots
                    async with contextlib.AsyncExitStack() as stack:
                        fronts = [
                            await stack.enter_async_context(
                                gateway(state, engine_list, routing, slots, MODEL, NODE, n == 0)
                            )
                            for n in range(cfg.gateways)
                        ]
                        bases, api_key = [base for base, _ in fronts], fronts[0][1]
                        pins = sessions if arm == "oracle" else None
                        target = via(bases, api_key, pins)
                        split = await run_arm(cfg, result, seed, requests, engine_list, target)
                        for base in bases:
                            for reason, count in (await routing_reasons(base)).items():
                                result.reasons[reason] = result.reasons.get(reason, 0.0) + count
            print(
                f"  {setting:<14} {arm:<14} {time.monotonic() - began:5.1f}s  {describe(split)}",
                file=sys.stderr,
            )
    return results


async def routing_reasons(base: str) -> dict[str, float]:
    """llmgw_routing_decisions counts by reason, summed over models ({} if not exported)."""
    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
        response = await client.get(base + "/metrics")
    found: dict[str, float] = {}
    for line in response.text.splitlines():
        if line.startswith("llmgw_routing_decisions_total") and 'reason="' in line:
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            with contextlib.suppress(ValueError):
                found[reason] = found.get(reason, 0.0) + float(line.rsplit(" ", 1)[1])
    return found


def chat_at(base: str, key: str, session: str | None = None) -> Destination:
    return Destination(base + "/v1/chat/completions", key, session)


def via(bases: Sequence[str], api_key: str, sessions: Sequence[str] | None) -> Target:
    """Every request through a gateway, request i through the i-th in turn; with `sessions`,
    each names its group's session."""

    def pick(index: int, request: BenchRequest) -> Destination:
        base = bases[index % len(bases)]
        return chat_at(base, api_key, sessions[request.group] if sessions else None)

    return pick


def direct(engine_list: Sequence[Engine]) -> Target:
    """Client-side pinning: group g's requests straight to engine g mod n."""

    def pick(_index: int, request: BenchRequest) -> Destination:
        engine = engine_list[request.group % len(engine_list)]
        return chat_at(engine.url, engine.key)

    return pick
