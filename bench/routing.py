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

Here the command line; the configuration and workload are bench/routing_workload.py's, running
the arms bench/routing_arms.py's, the report bench/routing_report.py's.

    .venv/bin/python -m bench.routing [--groups 4 --per-group 6 ...]
    .venv/bin/python -m bench.routing --arms today,sticky,least_load --in-flight 12 \
        --groups 6 --hot-groups 2 --hot-weight 4 --no-fair-queue
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence

from bench.routing_arms import run_bench
from bench.routing_gateway import decision_cost_us
from bench.routing_report import table
from bench.routing_workload import (
    ALL_ARMS,
    ARMS,
    SETTINGS,
    STICKY_TTFT_TARGET_S,
    BenchConfig,
    seeds,
)


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
