"""Fairness under a flood, on real engines: does one tenant's batch flood still delay everyone
else's interactive requests, with the gateway's fair queue off and on?

Two llama-server replicas of the demo SmolLM2 model serve on the CPU (`--parallel 2` each: 4
slots). One run starts them once and puts a gateway in front of them each way (the real app in
a process of its own, as `llmgw gateway` runs it; bench/fairness_gateway.py):
  off  `fair_queue` off: every request goes straight to an engine, which queues what its slots
       cannot take in arrival order;
  on   the fair queue: each replica is sent only as many requests as its engine runs at once
       (learnt from its gauges), the rest wait in the gateway, higher classes first and fair
       among keys by tokens.
Through each, two phases:
  no flood  three keys send interactive-class streams (short prompts, max_tokens 16) at a
            steady rate, each on its own schedule (not waiting for answers);
  flood     the same, while a fourth key keeps `--flood-factor` times the fleet's slots of
            batch-class streams open (max_tokens 128), a new one as each ends: ten times what
            the engines run at once.
`--spread` adds a third: the fair queue on two gateways on the same store and engines, the
flood split over both and the interactive keys on one, to see what a tenant gets by spreading.

Measured in each phase's window: the interactive requests' time to first token (p50/p90/p99),
the tokens that arrived in the window (every key's, llama-server streaming one token a chunk),
and how every request ended, drained ones included: status counts, Retry-After on every
429/503, and none lost (no answer by the end of the drain). Generation runs to max_tokens
(`ignore_eos`) so that both settings serve the same work.

    .venv/bin/python -m bench.fairness [--duration 40 --baseline 20 --replicas 2 --json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from bench.fairness_gateway import FLOOD_KEY, INTERACTIVE_KEYS, KEYS_FILENAME
from bench.fairness_report import (
    FLOOD,
    INTERACTIVE,
    NO_FLOOD,
    PhaseFigures,
    Sample,
    summarise,
    table,
    verdict,
    verdict_lines,
)
from bench.gateway.procs import (
    Child,
    StartFailed,
    routes_loaded,
    wait_for_file,
    wait_until,
    work_directory,
)
from bench.routing_engines import HEALTH_TIMEOUT_S, Engine, engines
from engines.local_port import free_port
from gateway.admission.priority import PRIORITY_HEADER
from gateway.settings import GatewaySettings
from store import open_store
from workflows.engine_keys import engine_key_from_master

MODEL = "smollm2-fairness"
NODE = "bench-node"
CHAT = "/v1/chat/completions"
PRIORITY = PRIORITY_HEADER.decode()
# Long enough for the engines' gauges to be scraped a few times (the depths learnt) before a
# phase's window opens.
SCRAPE_INTERVAL_S = GatewaySettings().engine_scrape_interval_s
_TOPICS = ("a lighthouse keeper", "a lost cat", "a river town", "a clockmaker", "a desert road")


@dataclass(frozen=True)
class FairnessConfig:
    replicas: int = 2
    parallel: int = 2
    threads: int = 1
    context: int = 4096
    duration: float = 45.0  # each flood phase's window, seconds
    baseline: float = 20.0  # each no-flood phase's window
    settle: float = 5.0  # flood running before its window opens
    drain: float = 180.0  # the most a phase waits for its last answers
    flood_factor: int = 10  # flood streams = this x the fleet's slots
    flood_tokens: int = 128
    interactive_tokens: int = 16
    # Interactive requests a second, per key: 3 keys x 0.5 x 16 tokens is about a quarter of
    # what two single-threaded replicas of the demo model generate on a 2-core machine.
    rate: float = 0.5
    spread: bool = False
    aging: float | None = None  # the gateways' queue_aging_s; None: the gateway's default
    seed: int = 7

    @property
    def flood_streams(self) -> int:
        return self.flood_factor * self.replicas * self.parallel


@dataclass(frozen=True)
class Gateway:
    base: str
    keys: dict[str, str]  # key name -> plaintext


# -- one request


async def send(
    client: httpx.AsyncClient,
    base: str,
    api_key: str,
    sample: Sample,
    prompt: str,
    max_tokens: int,
    priority: str,
    clock0: float,
) -> None:
    """One streamed chat completion, its outcome written into `sample` as it goes (times on
    the run's clock, which starts at `clock0`): a request cancelled mid-way keeps what it had."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    headers = {"Authorization": f"Bearer {api_key}", PRIORITY: priority}
    started = time.monotonic()
    try:
        async with client.stream("POST", base + CHAT, json=body, headers=headers) as response:
            if response.status_code != 200:
                await response.aread()
                sample.retry_after = response.headers.get("retry-after")
                sample.error = f"HTTP {response.status_code}: {response.text[:200]}"
                sample.status = response.status_code
                return
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if chunk.get("error"):
                    sample.error = f"error event: {json.dumps(chunk['error'])[:200]}"
                usage = chunk.get("usage")
                if usage:
                    sample.completion_tokens = int(usage.get("completion_tokens") or 0)
                for choice in chunk.get("choices") or []:
                    if (choice.get("delta") or {}).get("content"):
                        now = time.monotonic()
                        sample.tokens_at.append(now - clock0)
                        if sample.ttft_s is None:
                            sample.ttft_s = now - started
            sample.status = 200  # the stream ended: answered (an error event is kept above)
    except httpx.HTTPError as exc:
        sample.error = f"{type(exc).__name__}: {exc}"[:200]


# -- the load


def interactive_prompt(tag: str, n: int) -> str:
    return f"Question {tag}-{n}: in one short sentence, what colour is the sky at noon?"


def flood_prompt(tag: str, n: int) -> str:
    return f"Story {tag}-{n}: write a long story about {_TOPICS[n % len(_TOPICS)]}. Be detailed."


async def run_phase(
    cfg: FairnessConfig,
    client: httpx.AsyncClient,
    interactive_gateway: Gateway,
    flood_gateways: Sequence[Gateway],
    window_s: float,
    clock0: float,
    tag: str,
    depths_of: Gateway | None = None,
) -> tuple[list[Sample], tuple[float, float], dict[str, float]]:
    """One phase: the flood on `flood_gateways` (none: no flood), its streams split among
    them, running `settle` seconds before the window opens; the interactive keys through
    `interactive_gateway` during the window. Waits up to `drain` for every answer; one still
    open then is cancelled and counts as lost. Returns the samples, the window on the run's
    clock, and the depths `depths_of` had learnt at the window's end. `tag` is in every
    prompt: no phase finds another's prompts in the engines' prompt cache (llama-server keeps
    finished prompts in host memory), which would make its TTFTs and throughput look better."""
    rng = random.Random(cfg.seed)
    samples: list[Sample] = []
    tasks: list[asyncio.Task[None]] = []
    now = time.monotonic() - clock0
    start = now + (cfg.settle if flood_gateways else 0.0)
    end = start + window_s

    async def flood_stream(index: int, gateway: Gateway) -> None:
        sent = 0
        while time.monotonic() - clock0 < end:
            sample = Sample(FLOOD, FLOOD_KEY, time.monotonic() - clock0)
            samples.append(sample)
            prompt = flood_prompt(tag, index * 1000 + sent)
            await send(
                client,
                gateway.base,
                gateway.keys[FLOOD_KEY],
                sample,
                prompt,
                cfg.flood_tokens,
                "batch",
                clock0,
            )
            sent += 1
            if sample.refused:
                # As the openai SDK does with a 429 or 503: wait what Retry-After says.
                await asyncio.sleep(min(_seconds(sample.retry_after), 5.0))
            elif sample.status != 200:
                await asyncio.sleep(0.5)

    async def interactive_key(key: str, offset: float) -> None:
        interval = 1.0 / cfg.rate
        at, n = start + offset * interval, 0
        while at < end:
            await asyncio.sleep(max(0.0, at - (time.monotonic() - clock0)))
            sample = Sample(INTERACTIVE, key, time.monotonic() - clock0)
            samples.append(sample)
            prompt = interactive_prompt(tag, n)
            request = send(
                client,
                interactive_gateway.base,
                interactive_gateway.keys[key],
                sample,
                prompt,
                cfg.interactive_tokens,
                "interactive",
                clock0,
            )
            tasks.append(asyncio.create_task(request))
            n += 1
            # Steady but not in lock-step: each gap 50-150% of the mean.
            at += interval * rng.uniform(0.5, 1.5)

    for index in range(cfg.flood_streams if flood_gateways else 0):
        gateway = flood_gateways[index % len(flood_gateways)]
        tasks.append(asyncio.create_task(flood_stream(index, gateway)))
    senders = [
        asyncio.create_task(interactive_key(key, n / len(INTERACTIVE_KEYS)))
        for n, key in enumerate(INTERACTIVE_KEYS)
    ]
    await asyncio.sleep(max(0.0, end - (time.monotonic() - clock0)))
    depths = await learnt_depths(client, depths_of) if depths_of is not None else {}
    await asyncio.gather(*senders)
    _, pending = await asyncio.wait(tasks, timeout=cfg.drain) if tasks else (set(), set())
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for sample in samples:
        if sample.status == 0 and not sample.error:
            sample.error = f"no answer {cfg.drain:.0f} s after the window"
    return samples, (start, end), depths


def _seconds(retry_after: str | None) -> float:
    try:
        return max(0.0, float(retry_after or 1))
    except ValueError:
        return 1.0


async def learnt_depths(client: httpx.AsyncClient, gateway: Gateway) -> dict[str, float]:
    """llmgw_replica_depth by replica from the gateway's /metrics ({} when it has none)."""
    found: dict[str, float] = {}
    with contextlib.suppress(httpx.HTTPError):
        text = (await client.get(gateway.base + "/metrics")).text
        for line in text.splitlines():
            if line.startswith("llmgw_replica_depth{") and 'replica="' in line:
                replica = line.split('replica="', 1)[1].split('"', 1)[0]
                with contextlib.suppress(ValueError):
                    found[replica] = float(line.rsplit(" ", 1)[1])
    return found


# -- the servers


@contextlib.asynccontextmanager
async def gateway(
    cfg: FairnessConfig, state: Path, engine_list: Sequence[Engine], fair: bool
) -> AsyncIterator[Gateway]:
    """A gateway before `engine_list`; the first on `state` makes the benchmark's keys, the
    others read them. Its routes say each engine's slots (`--parallel`), as a llama.cpp
    replica's route does."""
    port = free_port()
    argv = [sys.executable, "-m", "bench.fairness_gateway", "--port", str(port)]
    argv += ["--state-dir", str(state), "--model", MODEL, "--node", NODE]
    for engine in engine_list:
        argv += ["--upstream", engine.url]
    if not fair:
        argv.append("--no-fair-queue")
    if cfg.aging is not None:
        argv += ["--queue-aging-s", str(cfg.aging)]
    argv += ["--slots", str(cfg.parallel)]
    key_file = state / KEYS_FILENAME
    if key_file.exists():
        argv.append("--no-keys")
    name = f"gateway-{'on' if fair else 'off'}-{port}"
    child = Child(name, argv, state / f"{name}.log", cpu=None)
    try:
        await asyncio.to_thread(wait_until, child, lambda: routes_loaded(port), HEALTH_TIMEOUT_S)
        keys = await asyncio.to_thread(wait_for_file, key_file, child, HEALTH_TIMEOUT_S)
        yield Gateway(f"http://127.0.0.1:{port}", json.loads(keys))
    except StartFailed as exc:
        raise SystemExit(f"the gateway failed to start: {exc}") from exc
    finally:
        await asyncio.to_thread(child.stop)


async def warm(client: httpx.AsyncClient, gw: Gateway, clock0: float) -> None:
    """A request per interactive key (first-request costs out of the figures), then time for
    the gateway to scrape the engines' gauges."""
    for key in INTERACTIVE_KEYS:
        sample = Sample(INTERACTIVE, key, 0.0)
        await send(client, gw.base, gw.keys[key], sample, "Say hi.", 2, "interactive", clock0)
        if sample.status != 200:
            raise SystemExit(f"warm-up through the gateway failed: {sample.error}")
    await asyncio.sleep(2 * SCRAPE_INTERVAL_S)


async def run_bench(cfg: FairnessConfig, log: Path | None, keep: bool) -> list[PhaseFigures]:
    figures: list[PhaseFigures] = []
    with work_directory("llmgw-bench-fairness-", keep) as state:
        store = open_store(None, state)
        await store.init()
        try:
            master = await store.master_secret()
        finally:
            await store.close()
        keys = [engine_key_from_master(master, NODE, f"bench-{i}") for i in range(cfg.replicas)]
        # No keep-alive: uvicorn closes idle connections, and a request that lands on one as
        # it closes fails before a byte (a new connection per request costs ~0.1 ms here).
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
        timeout = httpx.Timeout(cfg.settle + cfg.duration + cfg.drain + 60.0, connect=10.0)
        async with (
            engines(cfg, keys, (), state) as engine_list,
            httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client,
        ):
            clock0 = time.monotonic()

            def done(found: PhaseFigures, began: float) -> None:
                figures.append(found)
                print(
                    f"  {found.mode:<15} {found.phase:<9} {time.monotonic() - began:5.0f} s  "
                    f"p99 {found.ttft_p99_ms:,.0f} ms  {found.tokens_per_s:.0f} tok/s  "
                    f"{found.statuses}",
                    file=sys.stderr,
                )

            for fair in (False, True):
                mode = "on" if fair else "off"
                async with gateway(cfg, state, engine_list, fair) as gw:
                    await warm(client, gw, clock0)
                    for phase, flood, window in (
                        (NO_FLOOD, (), cfg.baseline),
                        (FLOOD, (gw,), cfg.duration),
                    ):
                        began = time.monotonic()
                        tag = f"{mode}-{phase}"
                        samples, span, depths = await run_phase(
                            cfg, client, gw, flood, window, clock0, tag, gw if fair else None
                        )
                        done(summarise(mode, phase, samples, span, depths), began)
                        _keep(log, mode, phase, samples)
            if cfg.spread:
                async with (
                    gateway(cfg, state, engine_list, True) as first,
                    gateway(cfg, state, engine_list, True) as second,
                ):
                    await warm(client, first, clock0)
                    await warm(client, second, clock0)
                    began = time.monotonic()
                    samples, span, depths = await run_phase(
                        cfg, client, first, (first, second), cfg.duration, clock0, "spread", first
                    )
                    mode = "on, 2 gateways"
                    done(summarise(mode, FLOOD, samples, span, depths), began)
                    _keep(log, mode, FLOOD, samples)
    return figures


def _keep(log: Path | None, mode: str, phase: str, samples: Sequence[Sample]) -> None:
    """Every request of a phase as a JSON line (--samples FILE), for a closer look."""
    if log is None:
        return
    with log.open("a") as out:
        for sample in samples:
            out.write(json.dumps({"mode": mode, "phase": phase, **asdict(sample)}) + "\n")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.fairness", description=__doc__.split("\n")[0])
    defaults = FairnessConfig()
    for name in ("replicas", "parallel", "threads", "flood_factor", "flood_tokens", "seed"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    p.add_argument("--interactive-tokens", type=int, default=defaults.interactive_tokens)
    for name in ("duration", "baseline", "settle", "drain", "rate"):
        p.add_argument(f"--{name}", type=float, default=getattr(defaults, name))
    p.add_argument("--spread", action="store_true", help="add the phase on two gateways")
    p.add_argument("--aging", type=float, help="the gateways' queue_aging_s (0: never age)")
    p.add_argument("--json", type=Path, dest="json_out", help="write the figures here")
    p.add_argument("--markdown", type=Path, help="write the table here")
    p.add_argument("--samples", type=Path, help="append every request here as JSON lines")
    p.add_argument("--keep", action="store_true", help="keep the logs and state directory")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    fields = FairnessConfig.__dataclass_fields__
    cfg = FairnessConfig(**{k: v for k, v in vars(args).items() if k in fields})
    print(
        f"{cfg.replicas} llama-server replicas (--parallel {cfg.parallel}, -t {cfg.threads}); "
        f"interactive: {len(INTERACTIVE_KEYS)} keys x {cfg.rate:g} req/s, max_tokens "
        f"{cfg.interactive_tokens}; flood: {cfg.flood_streams} streams of max_tokens "
        f"{cfg.flood_tokens} ({cfg.flood_factor}x the {cfg.replicas * cfg.parallel} slots); "
        f"windows {cfg.baseline:g} s (no flood) and {cfg.duration:g} s (flood, after "
        f"{cfg.settle:g} s)" + ("" if cfg.aging is None else f"; queue_aging_s {cfg.aging:g}"),
        file=sys.stderr,
    )
    began = time.monotonic()
    figures = asyncio.run(run_bench(cfg, args.samples, args.keep))
    found = verdict(figures)
    print()
    print(table(figures))
    print()
    for line in verdict_lines(found):
        print(line)
    slots = cfg.replicas * cfg.parallel
    for f in figures:
        if f.phase == FLOOD:
            print(
                f"{f.mode}: a flood stream's {cfg.flood_tokens} tokens took "
                f"{f.flood_generation_s:.1f} s (median), so with all {slots} slots busy one "
                f"frees every {f.flood_generation_s / slots:.2f} s on average"
            )
    depths = [f"{f.mode}: {f.depths}" for f in figures if f.depths and f.phase == FLOOD]
    if depths:
        print("depths learnt at the flood window's end: " + "; ".join(depths))
    print(f"took {time.monotonic() - began:.0f} s")
    if args.markdown is not None:
        args.markdown.write_text(table(figures, markdown=True) + "\n")
    if args.json_out is not None:
        report = {
            "config": asdict(cfg),
            "phases": [asdict(f) for f in figures],
            "verdict": asdict(found) if found is not None else None,
        }
        args.json_out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
