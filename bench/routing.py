"""Routing quality on real engines: does the gateway send requests where their prefix is cached?

Three llama-server replicas serve the demo SmolLM2 model on the CPU. The workload is groups of
requests sharing a long system prompt, interleaved, a few in flight, streamed. Each arm runs on
freshly started engines, so no arm inherits another's cache. The first three go through the same
gateway (the real app in a process of its own, as `llmgw gateway` runs it), so they pay the same
hop and differ only in where requests go:
  llmgw          the gateway's prefix-aware routing (its default policy)
  round_robin    the gateway's round-robin policy: request i to the next replica in turn
  oracle         each group pinned to replica g mod 3, through the gateway: every request names
                 a session (X-Session-Id) chosen so that the gateway's session hashing lands it
                 there. Every request after a group's first finds its prefix (unless slots are
                 short; see below)
  oracle_direct  the same pinning client-side, straight to the engines: what the hop costs
under two engine settings: llama.cpp's default prompt cache (slots plus up to 8 GiB of saved
prompts in host memory), and a small one (`--cache-ram 0`: a replica keeps only what its
`--parallel` slots hold, so a wrong choice evicts a group's prefix). With more groups than
replicas some share a replica, and then arrival order decides evictions between them: in the
small setting any arm, the oracle included, can win or lose by a wide margin from one --seed to
the next. So `--repeats N` runs every arm on N workloads (seeds seed to seed + N - 1) and sums
them: one workload's draw of that luck is not a measure of routing.

Reported per arm: mean and p90 time to first token, and the engines' cached share of prompt
tokens from their own counters: llama.cpp's `llamacpp:prompt_tokens_total` counts only the
tokens it computed (cached ones excluded), so the share is cached / (cached + computed). Each
ratio to the oracle's mean comes with a 95% interval (bench/intervals.py) over this run's
requests, and from 6 repeats on the mean's and the cached share's with one over whole
workloads, each paired with the oracle's on the same one.

Sticky until saturated (docs/sticky-routing.md): `--arms sticky,today,least_load` compares,
through the same gateway, the "prefix" policy with its TTFT target (`sticky`: 1 s unless
`--ttft-target-s`, whatever the setting's default), with the target at 0 (`today`: the
request-count margin decides when the holder of a prefix is overloaded) and the `least_load`
policy. Saturating them takes more requests in flight than the replicas serve within the target
(`--in-flight`), hot groups that get `--hot-weight` times the others' requests (`--hot-groups`),
and the fair queue off (`--no-fair-queue`): on, it holds each replica to about its slots, and no
policy can pile requests on one. Ratios are then to the first arm named. `--gateways N` sends
the arms that go through a gateway through N gateway processes on one store, request i through
the i-th in turn, as a load balancer would; they share their records over the peer bus.

    .venv/bin/python -m bench.routing [--groups 4 --per-group 6 ...]
    .venv/bin/python -m bench.routing --arms today,sticky,least_load --in-flight 12 \
        --groups 6 --hot-groups 2 --hot-weight 4 --no-fair-queue
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from bench.intervals import WorkloadSums, interval_text, mean_ratio_interval, workload_intervals
from bench.routing_engines import Engine, engines, prompt_counters
from bench.routing_gateway import decision_cost_us, gateway
from gateway.routing import affinity
from gateway.settings import GatewaySettings
from store import open_store
from workflows.contracts import Profile
from workflows.engine_keys import engine_key_from_master

MODEL = "smollm2-bench"
NODE = "bench-node"
# Engine flags per setting, on top of the common ones.
SETTINGS: dict[str, tuple[str, ...]] = {
    "default cache": (),
    "small cache": ("--cache-ram", "0"),
}
ARMS = ("llmgw", "round_robin", "oracle", "oracle_direct")
# The gateway's engine scrape period (its default `engine_scrape_interval_s`).
SCRAPE_INTERVAL_S = GatewaySettings().engine_scrape_interval_s
# The sticky arm's TTFT target unless --ttft-target-s: the one docs/sticky-routing.md argues
# for, named here so that the arm stays sticky while the setting's default is 0.
STICKY_TTFT_TARGET_S = 1.0
# The gateway's routing policy for each arm that goes through it, and its TTFT target for sticky
# routing (None: the setting's default; `sticky` takes --ttft-target-s where given).
GATEWAY_POLICY: dict[str, tuple[str, float | None]] = {
    "llmgw": ("prefix", None),
    "round_robin": ("round_robin", None),
    "oracle": ("prefix", None),
    "sticky": ("prefix", STICKY_TTFT_TARGET_S),
    "today": ("prefix", 0.0),
    "least_load": ("least_load", None),
}
ALL_ARMS = (*GATEWAY_POLICY, "oracle_direct")
# Words to build system prompts from: plain English, about one token a word for SmolLM2.
_VOCABULARY = """
the customer account invoice refund policy order shipping delivery address payment card
bank transfer error message support ticket priority manager team weekly report summary
contract clause liability warranty product service subscription renewal cancel upgrade
downgrade discount coupon receipt tax region currency language tone polite brief formal
answer question explain reason example detail step first then finally always never must
"""
_WORDS = _VOCABULARY.split()


@dataclass(frozen=True)
class BenchConfig:
    replicas: int = 3
    groups: int = 4
    per_group: int = 6
    in_flight: int = 3
    system_words: int = 150
    max_tokens: int = 4
    parallel: int = 2
    context: int = 4096
    threads: int = 1
    seed: int = 7
    # Runs of every arm, each on the workload of its own seed (seed, seed + 1, ...), summed: one
    # run of the small-cache setting can swing an arm's cached share by a third (the same
    # pinning gave 61% and 76% in one run), so compare a few.
    repeats: int = 1
    arms: tuple[str, ...] = ARMS
    # The first `hot_groups` groups get `hot_weight` requests a turn, the others one.
    hot_groups: int = 0
    hot_weight: int = 1
    fair_queue: bool = True
    ttft_target_s: float | None = None  # the sticky arm's; None: STICKY_TTFT_TARGET_S
    # Gateway processes on one store, each request to the next in turn (a load balancer's way);
    # they share their routing records over the peer bus (docs/peer-bus.md).
    gateways: int = 1
    settings: tuple[str, ...] = tuple(SETTINGS)


@dataclass(frozen=True)
class BenchRequest:
    group: int
    messages: list[dict[str, str]]


@dataclass
class ArmResult:
    setting: str
    arm: str
    ttft_s: list[float] = field(default_factory=list)
    cached: float = 0.0
    computed: float = 0.0
    errors: int = 0
    # The gateway's decisions by reason (llmgw arm only), from its own /metrics.
    reasons: dict[str, float] = field(default_factory=dict)
    # workload's seed -> this arm's sums on it (the engines count cached tokens per run)
    by_workload: dict[int, WorkloadSums] = field(default_factory=dict)

    @property
    def mean_ms(self) -> float:
        return 1000 * statistics.fmean(self.ttft_s) if self.ttft_s else float("nan")

    @property
    def p90_ms(self) -> float:
        if len(self.ttft_s) < 2:
            return self.mean_ms
        return 1000 * statistics.quantiles(self.ttft_s, n=10, method="inclusive")[-1]

    @property
    def cached_share(self) -> float:
        total = self.cached + self.computed
        return self.cached / total if total else float("nan")


def workload(cfg: BenchConfig) -> list[BenchRequest]:
    """`groups` system prompts; each group's requests add a short question of their own. The
    order interleaves the groups (shuffled each round) as concurrent users would; each turn
    has `hot_weight` requests of each of the first `hot_groups` groups, one of the others."""
    rng = random.Random(cfg.seed)
    systems = [
        f"You are assistant number {g}. " + " ".join(rng.choices(_WORDS, k=cfg.system_words))
        for g in range(cfg.groups)
    ]
    requests: list[BenchRequest] = []
    for turn in range(cfg.per_group):
        order = list(range(cfg.groups))
        order += [g for g in range(min(cfg.hot_groups, cfg.groups))] * (cfg.hot_weight - 1)
        rng.shuffle(order)
        for group in order:
            question = f"Question {turn}: " + " ".join(rng.choices(_WORDS, k=8)) + "?"
            messages = [
                {"role": "system", "content": systems[group]},
                {"role": "user", "content": question},
            ]
            requests.append(BenchRequest(group, messages))
    return requests


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


def gateway_routing(cfg: BenchConfig, arm: str) -> tuple[str, float | None, bool] | None:
    """How the arm's gateway routes (policy, TTFT target, fair queue); None: no gateway."""
    if arm not in GATEWAY_POLICY:
        return None
    policy, target = GATEWAY_POLICY[arm]
    if arm == "sticky" and cfg.ttft_target_s is not None:
        target = cfg.ttft_target_s
    return policy, target, cfg.fair_queue


def seeds(first: int, repeats: int) -> str:
    """The workloads' seeds that `--seed first --repeats N` runs, as the header names them."""
    return f"seed {first}" if repeats <= 1 else f"seeds {first}-{first + repeats - 1}"


def describe(split: Sequence[tuple[float, float]]) -> str:
    """Each engine's share of the run's prompt tokens and its own cached share: where the load
    went (4 groups on 3 replicas: about 50/25/25 when two groups share one) and what it hit."""
    total = sum(cached + computed for cached, computed in split) or 1.0
    return "  ".join(
        f"{(cached + computed) / total:4.0%} ({cached / (cached + computed or 1.0):4.0%} cached)"
        for cached, computed in split
    )


def pinning_sessions(groups: int, replica_ids: Sequence[str]) -> list[str]:
    """For each group g, a session name that the gateway's rendezvous hashing gives to replica
    g mod len(replica_ids): the oracle's pinning, expressed in a form the gateway honours."""
    sessions: list[str] = []
    for group in range(groups):
        wanted = group % len(replica_ids)
        session = next(
            name
            for name in (f"group-{group}-{n}" for n in itertools.count())
            if affinity.owner(name, replica_ids) == wanted
        )
        sessions.append(session)
    return sessions


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


def table(results: Sequence[ArmResult]) -> str:
    """Each arm's figures, and its ratios to the oracle's, or without one the first arm's."""
    named = "oracle" if any(r.arm == "oracle" for r in results) else results[0].arm
    lines = [
        f"{'setting':<14} {'arm':<14} {'n':>4} {'err':>3} {'mean TTFT':>10} {'p90 TTFT':>9} "
        f"{'cached':>7} {'mean/' + named:>11} {'95%: requests':>13} {'95%: workloads':>14} "
        f"{'p90/' + named:>10} {'cached/' + named:>13} {'95%: workloads':>14}"
    ]
    bases = {r.setting: r for r in reversed(results) if r.arm == named}
    for r in results:
        base = bases.get(r.setting)
        ratio = (r.mean_ms / base.mean_ms) if base else float("nan")
        ratio90 = (r.p90_ms / base.p90_ms) if base else float("nan")
        cached = (r.cached_share / base.cached_share) if base else float("nan")
        interval, mean_paired, cached_paired = "-", "-", "-"
        if base and base is not r:
            interval = interval_text(*mean_ratio_interval(r.ttft_s, base.ttft_s))
            means, shares = workload_intervals(r.by_workload, base.by_workload)
            mean_paired, cached_paired = interval_text(*means), interval_text(*shares)
        lines.append(
            f"{r.setting:<14} {r.arm:<14} {len(r.ttft_s):>4} {r.errors:>3} "
            f"{r.mean_ms:>8.0f}ms {r.p90_ms:>7.0f}ms {r.cached_share:>7.1%} "
            f"{ratio:>11.2f} {interval:>13} {mean_paired:>14} {ratio90:>10.2f} {cached:>13.2f} "
            f"{cached_paired:>14}"
        )
    for r in results:
        if r.reasons:
            counts = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r.reasons.items()))
            lines.append(f"gateway decisions ({r.setting}, {r.arm}): {counts}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench_routing", description=__doc__.split("\n")[0])
    defaults = BenchConfig()
    names = ("replicas", "groups", "per_group", "in_flight", "system_words", "threads", "seed")
    for name in (*names, "repeats", "hot_groups", "hot_weight", "gateways"):
        parser.add_argument(
            f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name)
        )
    parser.add_argument("--arms", default=",".join(ARMS), help=f"of {', '.join(ALL_ARMS)}")
    parser.add_argument("--settings", default=",".join(SETTINGS), help="engine settings")
    parser.add_argument("--ttft-target-s", type=float, help="the sticky arm's target")
    parser.add_argument("--no-fair-queue", action="store_true", help="the gateway's, off")
    args = parser.parse_args(argv)
    arms, settings = tuple(args.arms.split(",")), tuple(args.settings.split(","))
    if not arms or set(arms) - set(ALL_ARMS) or set(settings) - set(SETTINGS):
        parser.error(f"arms are of {', '.join(ALL_ARMS)}; settings of {', '.join(SETTINGS)}")
    cfg = BenchConfig(
        **{
            name: getattr(args, name)
            for name in (*names, "repeats", "hot_groups", "hot_weight", "gateways")
        },
        arms=arms,
        fair_queue=not args.no_fair_queue,
        ttft_target_s=args.ttft_target_s,
        settings=settings,
    )
    sticky = STICKY_TTFT_TARGET_S if cfg.ttft_target_s is None else cfg.ttft_target_s
    for target in (0.0, sticky):
        print(
            f"routing decision: {decision_cost_us(ttft_target_s=target):.1f} µs (4 KB prompt, "
            f"5 replicas, prefix, TTFT target {target:g} s)"
        )
    hot = f", {cfg.hot_groups} of them {cfg.hot_weight}x as many" if cfg.hot_groups else ""
    print(
        f"workload: {cfg.groups} groups x {cfg.per_group} requests{hot}, ~{cfg.system_words}-word "
        f"system prompts, {cfg.in_flight} in flight, {cfg.replicas} replicas "
        f"(--parallel {cfg.parallel}, -t {cfg.threads}), max_tokens {cfg.max_tokens}, "
        f"{cfg.repeats} run(s) of each arm, one workload each: {seeds(cfg.seed, cfg.repeats)}; "
        f"fair queue {'on' if cfg.fair_queue else 'off'}; {cfg.gateways} gateway(s)"
    )
    results = asyncio.run(run_bench(cfg))
    print(table(results))


if __name__ == "__main__":
    main()
