"""`llmgw bench gateway` (or `python -m bench.gateway`): what the gateway costs per
request, side by side with the floor of one Python hop and with two peers: LiteLLM's proxy and
vLLM's router.

A command, not a test. Six arms, each driven by the same load generator against the same
stand-in upstream:

  direct   the load generator straight to the stand-in;
  hop      a bare aiohttp reverse proxy (hop.py): the floor of one Python hop;
  llmgw    the real gateway app (target.py): auth, model allowlist, quota, routing, in-flight
           counts, usage accounting and metrics all on, a SQLite store, served by uvicorn;
  llmgw-otel
           the same, tracing every request to an OTLP receiver (otlp_sink.py);
  litellm  LiteLLM's proxy in config-file mode, no database;
  vllm-router
           vLLM's router (Rust), round robin, the stand-in as its one worker, no
           authentication (it has none): the fastest peer (vllm_router_arm.py).

Each peer is installed once into its own virtual environment (peer_venv.py); one that cannot be
is reported unavailable, with the reason, and the other arms run.

The proxy under test runs alone on one core; the stand-in and the load generator share the
other. Per arm: latency at concurrency 1 (added = less direct's), requests/s at concurrency 16
and 64, SSE streams/s at concurrency 16 and their time to first chunk; each a warm-up then a
fixed window. Also the proxy's CPU time per request (from /proc): on a machine shared with
other work, the figure that moves least from run to run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import uvloop

from bench.gateway import large, litellm_arm, paired, peer_venv, report, scale, vllm_router_arm
from bench.gateway.loadgen import LoadResult, build_request, run_load
from bench.gateway.options import Options, add_arguments
from bench.gateway.procs import (
    Child,
    Cores,
    StartFailed,
    cpu_seconds,
    http_post,
    pin_self,
    port_open,
    routes_loaded,
    wait_for_file,
    wait_until,
    work_directory,
)
from bench.gateway.stats import ArmFigures, ms, percentile
from bench.gateway.target import KEY_FILENAME, MODEL
from engines.local_port import free_port

PATH = "/v1/chat/completions"
HOST = "127.0.0.1"
START_TIMEOUT_S = 30.0
MESSAGES = [{"role": "user", "content": "Say hi."}]


@dataclass(frozen=True)
class Endpoint:
    """Where an arm listens, how to authenticate, and the process to account CPU to."""

    port: int
    authorization: str
    pid: int | None


def _module(name: str) -> list[str]:
    return [sys.executable, "-m", f"bench.gateway.{name}"]


@contextmanager
def _serving(arm: str, options: Options, cores: Cores, upstream: str) -> Iterator[Endpoint]:
    """Start the arm's proxy on the proxy core; stop it on the way out."""
    upstream_port = int(upstream.rpartition(":")[2])
    if arm == "direct":
        yield Endpoint(upstream_port, "Bearer bench", None)
        return
    port = free_port()
    child: Child
    extra: list[Child] = []  # processes the arm needs besides its proxy
    if arm == "hop":
        argv = [*_module("hop"), "--port", str(port), "--upstream", upstream]
        child = Child("hop", argv, options.workdir / "hop.log", cores.proxy)
        auth = "Bearer bench"
    elif arm in ("llmgw", "llmgw-otel"):
        state_dir = options.workdir / f"{arm}-state"
        argv = [
            *_module("target"),
            *("--port", str(port), "--upstream", upstream),
            *("--state-dir", str(state_dir), "--loop", options.gateway_loop),
        ]
        if arm == "llmgw-otel":
            sink_port = free_port()
            sink = Child(
                "otlp-sink",
                [*_module("otlp_sink"), "--port", str(sink_port)],
                options.workdir / "otlp-sink.log",
                cores.load,
            )
            extra.append(sink)
            wait_until(sink, lambda: port_open(sink_port), START_TIMEOUT_S)
            argv += ["--otlp-endpoint", f"http://{HOST}:{sink_port}"]
        child = Child(arm, argv, options.workdir / f"{arm}.log", cores.proxy)
        auth = ""
    elif arm == "litellm":
        exe = peer_venv.executable(options.litellm)
        print("starting LiteLLM (slow to start)", file=sys.stderr)
        child = litellm_arm.start(exe, upstream, port, options.workdir, cores.proxy)
        auth = f"Bearer {litellm_arm.MASTER_KEY}"
    elif arm == "vllm-router":
        exe = peer_venv.executable(options.vllm_router)
        child = vllm_router_arm.start(exe, upstream, port, options.workdir, cores.proxy)
        auth = "Bearer bench"
    else:
        raise ValueError(f"unknown arm {arm}")
    try:
        if arm in ("llmgw", "llmgw-otel"):
            wait_until(child, lambda: routes_loaded(port), START_TIMEOUT_S)
            auth = "Bearer " + wait_for_file(state_dir / KEY_FILENAME, child, START_TIMEOUT_S)
        else:
            wait_until(child, lambda: port_open(port), START_TIMEOUT_S)
        yield Endpoint(port, auth, child.process.pid)
    finally:
        child.stop()
        for process in extra:
            process.stop()


def _body(stream: bool) -> dict[str, object]:
    body: dict[str, object] = {"model": MODEL, "messages": MESSAGES, "max_tokens": 16}
    if stream:
        body["stream"] = True
    return body


def _probe(endpoint: Endpoint) -> None:
    """One plain and one streamed request through the arm, so a misconfigured arm is reported
    as such rather than measured as a fast error."""
    headers = {"Content-Type": "application/json", "Authorization": endpoint.authorization}
    for stream in (False, True):
        payload = json.dumps(_body(stream)).encode()
        status, body = http_post(endpoint.port, PATH, payload, headers)
        if status != 200 or (stream and b"[DONE]" not in body):
            kind = "streamed" if stream else "plain"
            raise StartFailed(f"a {kind} probe got HTTP {status}: {body[:300]!r}")


@dataclass(frozen=True)
class _Run:
    result: LoadResult
    wall_s: float
    # CPU seconds over the whole run (warm-up and drain included): the proxy process tree, and
    # the load side (this process plus the stand-in).
    proxy_cpu_s: float | None
    load_cpu_s: float

    def proxy_us_per_answer(self) -> float | None:
        if self.proxy_cpu_s is None or not self.result.answered:
            return None
        return self.proxy_cpu_s / self.result.answered * 1e6


class _Measure:
    def __init__(
        self, runner: asyncio.Runner, options: Options, endpoint: Endpoint, standin_pid: int
    ) -> None:
        self._runner = runner
        self._options = options
        self._endpoint = endpoint
        self._standin_pid = standin_pid
        self.errors = 0
        self.first_error: str | None = None

    def load(self, name: str, concurrency: int, stream: bool) -> _Run:
        endpoint = self._endpoint
        request = build_request(HOST, endpoint.port, PATH, _body(stream), endpoint.authorization)
        wall, own = time.perf_counter(), time.process_time()
        standin = cpu_seconds(self._standin_pid)
        proxy = cpu_seconds(endpoint.pid) if endpoint.pid else 0.0
        result = self._runner.run(
            run_load(
                HOST,
                endpoint.port,
                request,
                concurrency=concurrency,
                duration_s=self._options.duration_s,
                warmup_s=self._options.warmup_s,
                expect_done=stream,
            )
        )
        run = _Run(
            result=result,
            wall_s=time.perf_counter() - wall,
            proxy_cpu_s=cpu_seconds(endpoint.pid) - proxy if endpoint.pid else None,
            load_cpu_s=time.process_time() - own + cpu_seconds(self._standin_pid) - standin,
        )
        self.errors += result.errors
        self.first_error = self.first_error or result.first_error
        kind = "SSE streams/s" if stream else "req/s"
        per = run.proxy_us_per_answer()
        print(
            f"  {name:<11} c{concurrency:<3} {result.rate:>9,.0f} {kind:<13} "
            f"p50 {ms(percentile(result.latencies_s, 50)):7.3f} ms  "
            f"p99 {ms(percentile(result.latencies_s, 99)):7.3f} ms"
            + ("" if per is None else f"  proxy CPU {per:,.0f} us each")
            + (f"  {result.errors} errors" if result.errors else ""),
            file=sys.stderr,
        )
        return run


def measure(
    name: str, runner: asyncio.Runner, options: Options, endpoint: Endpoint, standin_pid: int
) -> ArmFigures:
    m = _Measure(runner, options, endpoint, standin_pid)
    one = m.load(name, 1, stream=False).result
    c16 = m.load(name, 16, stream=False).result
    c64 = m.load(name, 64, stream=False)
    sse = m.load(name, 16, stream=True)
    return ArmFigures(
        name=name,
        c1_p50_ms=ms(percentile(one.latencies_s, 50)),
        c1_p99_ms=ms(percentile(one.latencies_s, 99)),
        rps_c16=c16.rate,
        rps_c64=c64.result.rate,
        sse_c16=sse.result.rate,
        ttfc_p50_ms=ms(percentile(sse.result.first_byte_s, 50)),
        proxy_us_per_req=c64.proxy_us_per_answer(),
        proxy_us_per_stream=sse.proxy_us_per_answer(),
        proxy_cpu_c64=None if c64.proxy_cpu_s is None else c64.proxy_cpu_s / c64.wall_s,
        load_cpu_c64=c64.load_cpu_s / c64.wall_s,
        errors=m.errors,
        first_error=m.first_error,
    )


@dataclass
class ScaleFigures:
    workers: list[scale.WorkerFigures]
    quota: list[scale.QuotaFigures]


def _large(
    arm: str, runner: asyncio.Runner, options: Options, endpoint: Endpoint
) -> large.LargeFigures:
    target = large.Target(HOST, endpoint.port, PATH, endpoint.authorization, endpoint.pid)
    return large.measure(
        arm, runner, target, _body(False), MODEL, options.duration_s, options.warmup_s
    )


def _paired(
    runner: asyncio.Runner, options: Options, cores: Cores, upstream: str
) -> list[paired.PairedFigures]:
    """The hop and llmgw up at once on the proxy core, measured in turn and together
    (bench/gateway/paired)."""
    print("paired rounds, hop and llmgw in turn and together:", file=sys.stderr)
    with (
        _serving("hop", options, cores, upstream) as hop,
        _serving("llmgw", options, cores, upstream) as llmgw,
    ):
        targets = {
            arm: large.Target(HOST, e.port, PATH, e.authorization, e.pid)
            for arm, e in (("hop", hop), ("llmgw", llmgw))
        }
        return paired.measure(
            runner, targets, _body, MODEL, options.paired_rounds, options.duration_s
        )


def bench(
    options: Options,
    cores: Cores,
    large_out: list[large.LargeFigures] | None = None,
    paired_out: list[paired.PairedFigures] | None = None,
) -> tuple[list[ArmFigures], ScaleFigures]:
    port = free_port()
    standin = Child(
        "stand-in",
        [*_module("standin"), "--port", str(port), "--chunks", str(options.chunks)],
        options.workdir / "standin.log",
        cores.load,
    )
    upstream = f"http://{HOST}:{port}"
    figures: list[ArmFigures] = []
    scaled = ScaleFigures([], [])
    try:
        wait_until(standin, lambda: port_open(port), START_TIMEOUT_S)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            for arm in options.arms:
                print(f"{arm}:", file=sys.stderr)
                try:
                    with _serving(arm, options, cores, upstream) as endpoint:
                        _probe(endpoint)
                        figures.append(measure(arm, runner, options, endpoint, standin.process.pid))
                        if large_out is not None and options.large_prompts and arm in large.ARMS:
                            large_out.append(_large(arm, runner, options, endpoint))
                except (StartFailed, peer_venv.Unavailable) as exc:
                    print(f"  unavailable: {exc}", file=sys.stderr)
                    figures.append(ArmFigures(name=arm, unavailable=str(exc)))
            if paired_out is not None and options.paired_rounds and options.paired_arms:
                paired_out += _paired(runner, options, cores, upstream)
            if options.scale_out:
                try:
                    print("workers (not pinned):", file=sys.stderr)
                    scaled.workers = scale.measure_workers(
                        upstream, options.workdir, runner, options.duration_s, options.warmup_s
                    )
                    print("quota, two gateways on one store:", file=sys.stderr)
                    scaled.quota = scale.measure_quota(
                        upstream, options.workdir, runner, options.quota_store
                    )
                except StartFailed as exc:
                    print(f"  unavailable: {exc}", file=sys.stderr)
    finally:
        standin.stop()
    return figures, scaled


def setup_line(options: Options, cores: Cores) -> str:
    pinning = (
        f"proxy on CPU {cores.proxy}, stand-in + load generator on CPU {cores.load}"
        if cores.pinned
        else "not pinned (fewer than 2 usable CPUs)"
    )
    versions = f"Python {platform.python_version()}"
    if not isinstance(options.litellm, str):
        versions += f", LiteLLM {litellm_arm.version()}"
    if not isinstance(options.vllm_router, str):
        versions += f", vLLM router {vllm_router_arm.version()}"
    return (
        f"{options.warmup_s:g} s warm-up + {options.duration_s:g} s per figure; {pinning}; "
        f"SSE stream of {options.chunks} chunks + finish + usage + [DONE]; gateway loop: "
        f"{options.gateway_loop}; {versions}; closed loop, keep-alive, latencies in ms."
    )


def run(args: argparse.Namespace) -> int:
    cores = Cores.pick()
    started = time.monotonic()
    # Before pinning: a first install is long and may use every core.
    litellm = peer_venv.executable_or_reason("litellm" in args.only, litellm_arm.ensure_installed)
    vllm_router = peer_venv.executable_or_reason(
        "vllm-router" in args.only, vllm_router_arm.ensure_installed
    )
    try:
        with work_directory("llmgw-bench-gateway-", args.keep) as workdir:
            options = Options(
                arms=args.only,
                duration_s=args.duration,
                warmup_s=args.warmup,
                chunks=args.chunks,
                gateway_loop=args.gateway_loop,
                workdir=workdir,
                litellm=litellm,
                vllm_router=vllm_router,
                scale_out=not args.no_scale,
                large_prompts=not args.no_large,
                quota_store=args.quota_store,
                paired_rounds=args.paired_rounds,
            )
            pin_self(cores.load)
            large_figures: list[large.LargeFigures] = []
            paired_figures: list[paired.PairedFigures] = []
            figures, scaled = bench(options, cores, large_figures, paired_figures)
    except StartFailed as exc:
        print(f"the stand-in upstream did not start: {exc}", file=sys.stderr)
        return 1
    setup = setup_line(options, cores)
    print()
    print(report.text_table(figures))
    print()
    goals = [*report.goal_lines(figures), *paired.lines(paired_figures)]
    for line in [*report.ratio_lines(figures), "", *goals]:
        print(line)
    for line in report.error_lines(figures):
        print(line)
    large_lines = large.lines(large_figures)
    if large_lines:
        print()
        for line in large_lines:
            print(line)
    scale_lines = scale.lines(scaled.workers, scaled.quota)
    if scale_lines:
        print()
        for line in scale_lines:
            print(line)
    print(f"\n{setup}\ntook {time.monotonic() - started:.0f} s")
    if args.markdown is not None:
        args.markdown.write_text(
            report.markdown(figures, setup)
            + "".join(f"- {line}\n" for line in paired.lines(paired_figures))
            + ("\n" + large.markdown(large_figures) if large_figures else "")
        )
    if args.json_out is not None:
        args.json_out.write_text(
            json.dumps(
                {
                    "setup": setup,
                    "arms": [asdict(f) for f in figures],
                    "scale": asdict(scaled),
                    "large": [asdict(f) for f in large_figures],
                    "paired": [asdict(f) for f in paired_figures],
                },
                indent=2,
            )
            + "\n"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="llmgw bench gateway",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
