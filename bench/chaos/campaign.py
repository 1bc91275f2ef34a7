"""The campaign loop and its command line:

    .venv/bin/python -m bench.chaos [--rounds 5 --seed 1 --freeze-max 70 --only agent,engine
                                       --actions kill,freeze,terminate,cancel,reset
                                       --markdown FILE]

Starts `llmgw up` (system.py), waits until both replicas serve, starts the load, then for each
planned round signals the chosen process (or terminates, cancels or resets the chosen workflow:
workflow_faults.py), keeps sampling while it is frozen, resumes it, and
waits until the system has converged and stayed converged for --settle seconds (a fault whose
consequences come late, a node declared lost a little after Temporal returns, is still caught).
Exit status 1 when a hard invariant failed (report.py), 2 when the system never came up."""

import argparse
import asyncio
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.chaos.checks import Snapshot, double_booked, duplicates, not_converged, ready_replicas
from bench.chaos.inject import NoVictim, Signaller, child_pid, pick_engine
from bench.chaos.load import Load
from bench.chaos.observe import Observer
from bench.chaos.plan import (
    ACTIONS,
    KILL,
    PROCESS_TARGETS,
    TARGETS,
    TERMINATE,
    Fault,
    parse_targets,
    plan_rounds,
)
from bench.chaos.report import Kill, RoundResult, Summary, count_requests, render, split_by_round
from bench.chaos.system import NODE, UpProcess
from bench.chaos.workflow_faults import hit, victim
from workflows.client import connect

SAMPLE_EVERY_S = 1.0


@dataclass(frozen=True)
class Options:
    rounds: int = 5
    seed: int = 1
    freeze_min: float = 5.0
    freeze_max: float = 70.0
    only: tuple[str, ...] = TARGETS
    actions: tuple[str, ...] = ACTIONS
    replicas: int = 2
    clients: int = 3
    every_s: float = 1.0
    max_tokens: int = 8
    settle_s: float = 15.0
    converge_timeout_s: float = 180.0
    start_timeout_s: float = 900.0
    warmup_s: float = 10.0
    state_dir: Path | None = None
    markdown: Path | None = None


def say(text: str) -> None:
    print(text, flush=True)


def engines_of(snap: Snapshot, model: str) -> dict[str, str]:
    """Ready replica -> the identity of the live engine its agent spec names."""
    if snap.ledger is None:
        return {}
    running = {e.identity for e in snap.engines}
    return {
        r: snap.shards[r].identity
        for r in ready_replicas(snap.ledger, model)
        if r in snap.shards and snap.shards[r].identity in running
    }


class Campaign:
    def __init__(self, opts: Options, up: UpProcess, observer: Observer, model: str) -> None:
        self.opts, self.up, self.observer, self.model = opts, up, observer, model
        self.signaller = Signaller()
        self.kills: list[Kill] = []
        self.rng = random.Random(opts.seed + 1)  # engine choice; the plan has its own stream
        self.http = httpx.AsyncClient(timeout=2.0)
        self.last: Snapshot | None = None

    async def sample(self, result: RoundResult | None = None) -> Snapshot:
        snap = await self.observer.take(self.http)
        self.last = snap
        if result is not None:
            for problem in double_booked(snap, NODE):
                if problem not in result.double_booked:
                    result.double_booked.append(problem)
            for problem in duplicates(snap, NODE, self.model, self.opts.replicas):
                if problem not in result.duplicated:
                    result.duplicated.append(problem)
        return snap

    async def converge(
        self,
        since: float,
        timeout_s: float,
        result: RoundResult | None = None,
        verbose: bool = False,
    ) -> tuple[float | None, list[str]]:
        """Seconds from `since` until converged for good (stable for settle_s), or None and
        what it was still waiting on at the timeout."""
        stable_from: float | None = None
        waiting: list[str] = []
        while True:
            snap = await self.sample(result)
            now_waiting = not_converged(snap, NODE, self.model, self.opts.replicas)
            if verbose and now_waiting and now_waiting != waiting:
                say(f"  ... {'; '.join(now_waiting)}")
            waiting = now_waiting
            if waiting:
                stable_from = None
            else:
                stable_from = stable_from if stable_from is not None else snap.taken_at
                if snap.taken_at - stable_from >= self.opts.settle_s:
                    return stable_from - since, []
            if time.monotonic() - since > timeout_s:
                return None, waiting
            await asyncio.sleep(SAMPLE_EVERY_S)

    async def round(self, number: int, fault: Fault) -> RoundResult:
        before = await self.sample()
        if before.ledger is None:
            raise NoVictim("the ledger does not answer, so nothing can be compared after")
        result = RoundResult(
            number, fault, 0, time.monotonic(), None,
            ready_replicas(before.ledger, self.model), [], engines_of(before, self.model), {},
        )  # fmt: skip
        if fault.target not in PROCESS_TARGETS:
            await self.hit_workflow(fault, before)
        else:
            await self.signal_process(fault, before, result)
        ended = time.monotonic()
        timeout = self.opts.converge_timeout_s
        result.converged_s, result.waiting_on = await self.converge(ended, timeout, result, True)
        assert self.last is not None
        if self.last.ledger is not None:
            result.replicas_after = ready_replicas(self.last.ledger, self.model)
        result.engines_after = engines_of(self.last, self.model)
        return result

    async def signal_process(self, fault: Fault, before: Snapshot, result: RoundResult) -> None:
        """Kill the round's process, or freeze it (sampling meanwhile) and resume it."""
        if fault.target == "engine":
            shard = pick_engine(before.shards, before.engines, self.rng)
            result.pid, result.killed_replica = shard.pid, shard.replica_id
        else:
            result.pid = child_pid(self.up.state_dir, fault.target)
        if fault.action == KILL:
            self.signaller.kill(result.pid)
            self.kills.append(Kill(fault.target, time.monotonic()))
            return
        result.killed_replica = None
        self.signaller.freeze(result.pid)
        try:
            thaw = time.monotonic() + fault.freeze_s
            while time.monotonic() < thaw:
                await self.sample(result)
                await asyncio.sleep(max(0.0, min(SAMPLE_EVERY_S, thaw - time.monotonic())))
        finally:
            self.signaller.resume(result.pid)

    async def hit_workflow(self, fault: Fault, before: Snapshot) -> None:
        """Terminate, cancel or reset the round's workflow; a terminated model is applied
        again, as an operator is told to (a model's definition lives in its workflow)."""
        assert before.ledger is not None
        workflow_id = victim(fault.target, NODE, self.model, before.ledger, self.rng)
        say(f"  {fault.action} {workflow_id}")
        client = await connect(self.up.temporal)
        await hit(client, workflow_id, fault.action)
        if fault.target == "model-workflow" and fault.action == TERMINATE:
            await self.up.define_model(self.opts.replicas)

    async def run(self, faults: list[Fault]) -> Summary:
        say(f"waiting for {self.opts.replicas} replicas of {self.model} to serve")
        took, waiting = await self.converge(time.monotonic(), self.opts.start_timeout_s, None, True)
        if took is None:
            raise SystemExit(f"never converged: {'; '.join(waiting)}\n{self.up.tail()}")
        load = Load(self.up.base_url, self.up.api_key, self.model, self.opts.clients,
                    self.opts.every_s, self.opts.max_tokens, self.opts.freeze_max + 80)  # fmt: skip
        load.start()
        results: list[RoundResult] = []
        try:
            await asyncio.sleep(self.opts.warmup_s)
            for number, fault in enumerate(faults, 1):
                say(f"round {number}/{len(faults)}: {fault.describe()}")
                try:
                    result = await self.round(number, fault)
                except NoVictim as err:
                    say(f"  skipped: {err}")  # only after a round that never converged
                    continue
                results.append(result)
                lost, (asked, unwanted) = result.lost, result.restarts
                after = "never" if result.converged_s is None else f"{result.converged_s:.1f} s"
                say(f"  pid {result.pid}; converged after {after}; replicas lost {lost}, "
                    f"engines restarted {asked}, restarted unasked {unwanted}")  # fmt: skip
        finally:
            self.signaller.resume_all()
            await load.stop()
            await self.http.aclose()
        starts = [r.began for r in results]
        for result, records in zip(results, split_by_round(load.records, starts), strict=True):
            result.requests = count_requests(records, self.kills)
        total = count_requests(load.records, self.kills)
        return Summary(self.opts.seed, results, total, self.opts.replicas)


async def run_campaign(opts: Options) -> int:
    freeze_range = (opts.freeze_min, opts.freeze_max)
    faults = plan_rounds(opts.rounds, opts.seed, opts.only, freeze_range, opts.actions)
    state_dir = opts.state_dir or Path(tempfile.mkdtemp(prefix="llmgw-chaos-"))
    say(f"plan: {', '.join(f.describe() for f in faults)}")
    say(f"starting llmgw up in {state_dir} (logs: {state_dir / 'logs'})")
    up = UpProcess(state_dir)
    signaller: Signaller | None = None
    try:
        await asyncio.to_thread(up.start)
        model = await up.define_model(opts.replicas)
        observer = Observer(up.temporal, state_dir, NODE, model, str(up.weights),
                            up.base_url, up.api_key)  # fmt: skip
        campaign = Campaign(opts, up, observer, model)
        signaller = campaign.signaller
        summary = await campaign.run(faults)
    finally:
        if signaller is not None:
            signaller.resume_all()
        say("stopping llmgw up")
        await asyncio.to_thread(up.stop)
    text = render(summary)
    say("\n" + text)
    if opts.markdown is not None:
        opts.markdown.write_text(text + "\n")
    return 1 if summary.hard_failures() else 0


def parse_args(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.chaos", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=Options.rounds)
    parser.add_argument("--seed", type=int, default=Options.seed)
    parser.add_argument("--freeze-min", type=float, default=Options.freeze_min, metavar="S")
    parser.add_argument("--freeze-max", type=float, default=Options.freeze_max, metavar="S")
    parser.add_argument("--only", default=",".join(TARGETS), help="targets, comma-separated")
    parser.add_argument("--actions", default=",".join(ACTIONS), help=f"any of {', '.join(ACTIONS)}")
    parser.add_argument("--replicas", type=int, default=Options.replicas)
    parser.add_argument("--clients", type=int, default=Options.clients)
    parser.add_argument("--every", type=float, default=Options.every_s, metavar="S",
                        help="seconds between one client's requests")  # fmt: skip
    parser.add_argument("--settle", type=float, default=Options.settle_s, metavar="S",
                        help="how long converged must hold to count")  # fmt: skip
    parser.add_argument("--converge-timeout", type=float, default=Options.converge_timeout_s)
    parser.add_argument("--state-dir", type=Path, help="default: a new temporary directory")
    parser.add_argument("--markdown", type=Path, metavar="FILE", help="also write the report")
    args = parser.parse_args(argv)
    try:
        only = parse_targets(args.only)
    except ValueError as err:
        parser.error(str(err))
    actions = tuple(a.strip() for a in args.actions.split(",") if a.strip())
    if not actions or set(actions) - set(ACTIONS):
        parser.error(f"--actions wants some of {', '.join(ACTIONS)}, comma-separated")
    if args.rounds < 1 or args.replicas < 1 or args.clients < 1:
        parser.error("--rounds, --replicas and --clients want at least 1")
    if not 0 < args.freeze_min <= args.freeze_max:
        parser.error("want 0 < --freeze-min <= --freeze-max")
    return Options(
        rounds=args.rounds, seed=args.seed, freeze_min=args.freeze_min,
        freeze_max=args.freeze_max, only=only, actions=actions, replicas=args.replicas,
        clients=args.clients,
        every_s=args.every, settle_s=args.settle, converge_timeout_s=args.converge_timeout,
        state_dir=args.state_dir, markdown=args.markdown,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    sys.exit(asyncio.run(run_campaign(parse_args(argv))))
