"""`make bench-abuse` (python -m bench.abuse): does a hostile client hurt a good one?

A command, not a test (issue 11). The real gateway (bench/abuse_target.py: the app,
a SQLite store, uvicorn, in a process of its own on one core) in front of a stand-in engine
(bench/abuse_upstream.py). A well-behaved client sends steady chat completions,
streamed and not, first alone ("quiet"), then beside each abuse kind alone, then beside all of
them at once ("all"). Abuse kinds are listed in bench/abuse_clients.py.

Printed side by side from the one run: the good client's p50/p99 and errors per phase, the
ratio of each phase's p99 to the quiet one's (goal: no errors, within 2x), what the gateway
answered each abusive client, and the gateway process's resident memory, start and peak, per
phase (/proc: peak RSS is reset at each phase's start where the kernel allows, and sampled).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.abuse_clients import KINDS
from bench.abuse_report import (
    ALL,
    QUIET,
    QUIET_AFTER,
    AbuseFigures,
    GoodFigures,
    Phase,
    report,
)
from bench.abuse_target import KEYS_FILENAME
from bench.gateway.procs import (
    Child,
    Cores,
    StartFailed,
    http_get,
    http_post,
    pin_self,
    port_open,
    wait_for_file,
    wait_until,
    work_directory,
)
from engines.local_port import free_port

HOST = "127.0.0.1"
START_TIMEOUT_S = 30.0
# Abusers start this long before the good client, so they are at full strength in its window.
ABUSE_LEAD_S = 1.5
# Between phases: connections the last phase's abusers left are closed, the gateway settles.
SETTLE_S = 2.0
# Passed through to every abuse process unchanged.
ABUSE_OPTIONS = ("prompt_mb", "big_mb", "big_at_once", "slow", "slow_tokens", "bad_key_rate")


def _module(name: str) -> list[str]:
    return [sys.executable, "-m", f"bench.{name}"]


def _kb(line: str) -> float:
    return int(line.split()[1]) / 1024  # "VmRSS:   123456 kB" -> MB


class RssWatch:
    """A process's resident memory over one phase: its peak (VmHWM) reset at the start
    through /proc/PID/clear_refs where the kernel lets us, else sampled every 50 ms."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._stop = threading.Event()
        self._sampled = 0.0
        self.start_mb: float | None = None
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")  # resets the peak RSS to the current RSS
            self._reset = True
        except OSError:
            self._reset = False
        self.start_mb = self._read("VmRSS")
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _read(self, field: str) -> float | None:
        try:
            with open(f"/proc/{self._pid}/status") as f:
                for line in f:
                    if line.startswith(field + ":"):
                        return _kb(line)
        except OSError:
            pass
        return None

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self._sampled = max(self._sampled, self._read("VmRSS") or 0.0)

    def peak_mb(self) -> float | None:
        self._stop.set()
        self._thread.join()
        peaks = [self._sampled] + ([self._read("VmHWM") or 0.0] if self._reset else [])
        return max(peaks) or None


@dataclass(frozen=True)
class Setup:
    workdir: Path
    gateway: Child
    cores: Cores
    port: int
    keys: Path
    blocks: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def next_block(self) -> int:
        """A fresh 127.N.0.0/16 for each phase's bad-key spray."""
        return next(self.blocks)


def run_phase(
    name: str, kinds: list[str], duration_s: float, args: argparse.Namespace, setup: Setup
) -> Phase:
    workdir, gateway, cores = setup.workdir, setup.gateway, setup.cores
    common = ["--port", str(setup.port), "--keys", str(setup.keys)]
    print(
        f"{name}: {duration_s:g} s" + (f" beside {','.join(kinds)}" if kinds else ""),
        file=sys.stderr,
    )
    watch = RssWatch(gateway.process.pid)
    abusers = None
    abuse_out = workdir / f"{name}-abuse.json"
    if kinds:
        extra = [f"--{o.replace('_', '-')}={getattr(args, o)}" for o in ABUSE_OPTIONS]
        argv = [*_module("abuse_clients"), "abuse", *common, "--kinds", ",".join(kinds)]
        abuse_s = ABUSE_LEAD_S + args.warmup + duration_s + 0.5
        argv += ["--duration", str(abuse_s), "--out", str(abuse_out)]
        argv += ["--spray-block", str(setup.next_block())]
        abusers = Child("abusers", argv + extra, workdir / f"{name}-abuse.log", cores.load)
        time.sleep(ABUSE_LEAD_S)
    good_out = workdir / f"{name}-good.json"
    argv = [*_module("abuse_clients"), "good", *common, "--rate", str(args.rate)]
    argv += ["--duration", str(duration_s), "--warmup", str(args.warmup), "--out", str(good_out)]
    good = Child("good client", argv, workdir / f"{name}-good.log", cores.load)
    good.process.wait()
    if abusers is not None:
        abusers.process.wait()
    phase = Phase(name, GoodFigures(), rss_start_mb=watch.start_mb, rss_peak_mb=watch.peak_mb())
    if good.process.returncode != 0 or not good_out.exists():
        raise StartFailed(f"the good client failed:\n{good.log_tail()}")
    phase.good = GoodFigures(**json.loads(good_out.read_text()))
    if abusers is not None:
        if abusers.process.returncode != 0 or not abuse_out.exists():
            raise StartFailed(f"the abusive clients failed:\n{abusers.log_tail()}")
        phase.abuse = [AbuseFigures(**a) for a in json.loads(abuse_out.read_text())]
    if gateway.exited() is not None:
        raise StartFailed(f"the gateway exited during {name}:\n{gateway.log_tail()}")
    good_p99 = phase.good.p_ms(99)
    print(f"  good: {phase.good.errors} errors, p99 {good_p99:.1f} ms", file=sys.stderr)
    time.sleep(SETTLE_S)
    return phase


def _ready(port: int) -> bool:
    status, body = http_get(port, "/healthz")
    return status == 200 and json.loads(body).get("routes_version") == 1


def bench(args: argparse.Namespace, workdir: Path) -> list[Phase]:
    cores = Cores.pick()
    pin_self(cores.load)
    up_port, gw_port = free_port(), free_port()
    upstream = Child(
        "stand-in",
        [*_module("abuse_upstream"), "--port", str(up_port)],
        workdir / "upstream.log",
        cores.load,
    )
    state = workdir / "gateway-state"
    argv = [*_module("abuse_target"), "--port", str(gw_port)]
    argv += ["--upstream", f"http://{HOST}:{up_port}", "--state-dir", str(state)]
    gateway = Child("llmgw", argv, workdir / "gateway.log", cores.proxy)
    try:
        wait_until(upstream, lambda: port_open(up_port), START_TIMEOUT_S)
        wait_until(gateway, lambda: _ready(gw_port), START_TIMEOUT_S)
        keys = json.loads(wait_for_file(state / KEYS_FILENAME, gateway, START_TIMEOUT_S))
        _probe(gw_port, keys["good"])
        env = Setup(workdir, gateway, cores, gw_port, state / KEYS_FILENAME)
        phases = [run_phase(QUIET, [], args.duration, args, env)]
        if args.solo_duration > 0:
            phases += [run_phase(k, [k], args.solo_duration, args, env) for k in args.only]
        phases.append(run_phase(ALL, list(args.only), args.duration, args, env))
        # Whether the gateway is itself again once the abuse stops (memory, held connections),
        # and how much the quiet figure moves within one run: the noise floor of the ratios.
        phases.append(run_phase(QUIET_AFTER, [], args.solo_duration or args.duration, args, env))
        return phases
    finally:
        gateway.stop()
        upstream.stop()


def _probe(port: int, key: str) -> None:
    """One request through the gateway before measuring, so a broken set-up is reported as
    such rather than measured as errors."""
    body = json.dumps({"model": "mock", "messages": [{"role": "user", "content": "hi"}]})
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    status, answer = http_post(port, "/v1/chat/completions", body.encode(), headers)
    if status != 200:
        raise StartFailed(f"a probe got HTTP {status}: {answer[:300]!r}")


def _kinds(text: str) -> tuple[str, ...]:
    chosen = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in chosen if k not in KINDS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"choose among {','.join(KINDS)}")
    return tuple(k for k in KINDS if k in chosen)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.abuse",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--duration", type=float, default=20.0, help="quiet and all phases (s)")
    p.add_argument(
        "--solo-duration", type=float, default=8.0, help="each kind alone (s); 0 skips these"
    )
    p.add_argument("--rate", type=float, default=20.0, help="good client requests/s")
    p.add_argument(
        "--warmup", type=float, default=1.0, help="good client's uncounted start, each phase (s)"
    )
    p.add_argument("--only", type=_kinds, default=KINDS, metavar="KINDS", help=",".join(KINDS))
    p.add_argument("--prompt-mb", type=int, default=4, help="size of the [[0],...] body")
    p.add_argument("--big-mb", type=int, default=16, help="size of the large bodies")
    p.add_argument("--big-at-once", type=int, default=4, help="large bodies sent together")
    p.add_argument("--slow", type=int, default=16, help="slow-reader connections")
    p.add_argument("--slow-tokens", type=int, default=100_000, help="events per slow stream")
    p.add_argument("--bad-key-rate", type=float, default=200.0, help="bad keys/s, many addresses")
    p.add_argument("--markdown", type=Path, help="also write the tables here (Markdown)")
    p.add_argument("--json", dest="json_out", type=Path, help="also write every figure here")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    started = time.monotonic()
    try:
        with work_directory("llmgw-bench-abuse-", args.keep) as workdir:
            phases = bench(args, workdir)
    except StartFailed as exc:
        print(f"bench-abuse failed: {exc}", file=sys.stderr)
        return 1
    print()
    print(report(phases))
    print(
        f"\ngood client: {args.rate:g} req/s, chat completions streamed and not in turn; "
        f"phases {args.duration:g} s (quiet, all) and {args.solo_duration:g} s (each kind, "
        f"quiet after), each after {args.warmup:g} s of warm-up; "
        f"took {time.monotonic() - started:.0f} s"
    )
    if args.markdown is not None:
        args.markdown.write_text(report(phases, markdown=True) + "\n")
    if args.json_out is not None:
        args.json_out.write_text(json.dumps([asdict(p) for p in phases], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
