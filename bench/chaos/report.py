"""The campaign's arithmetic and its printed report (Markdown, readable as plain text too).

A failed request is excused only when it was in flight at the instant the campaign SIGKILLed an
engine or the gateway: no system can finish a request inside a process that was killed under
it. With two replicas the report cannot tell which engine a request was on, so "in flight on a
killed engine" is an upper bound: a request that failed on the other engine at that moment is
excused too. Every other failure is a hard failure, as are a replica lost, duplicated or never
ready again, and a device double-booked at any sample. Engine restarts nobody asked for are
reported, not counted as hard: a frozen engine restarted by its health check is defensible."""

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.chaos.checks import engine_changes
from bench.chaos.load import OK, RequestRecord
from bench.chaos.plan import KILL, Fault

# Processes whose SIGKILL may fail the requests in flight inside them, and the label it gets.
EXCUSED = {"engine": "killed engine", "gateway": "killed gateway"}
OTHER = "other"
SHOWN = 6  # problems listed per kind; the rest are counted


@dataclass(frozen=True)
class Kill:
    target: str
    at: float  # monotonic


def blame(record: RequestRecord, kills: Sequence[Kill]) -> str:
    """OK, the EXCUSED label of a kill the failed request was in flight at, or OTHER."""
    if record.ok:
        return OK
    for kill in kills:
        if kill.target in EXCUSED and record.started <= kill.at <= record.ended:
            return EXCUSED[kill.target]
    return OTHER


@dataclass
class RequestCounts:
    sent: int = 0
    ok: int = 0
    excused: Counter[str] = field(default_factory=Counter)  # EXCUSED label -> failed requests
    other: Counter[str] = field(default_factory=Counter)  # outcome -> failed requests
    refused_requests: int = 0  # requests that got through only after refused connections
    refused_attempts: int = 0
    slowest_s: float = 0.0

    @property
    def failed_other(self) -> int:
        return sum(self.other.values())


def count_requests(records: Sequence[RequestRecord], kills: Sequence[Kill]) -> RequestCounts:
    counts = RequestCounts()
    for record in records:
        counts.sent += 1
        counts.slowest_s = max(counts.slowest_s, record.ended - record.started)
        if record.refused:
            counts.refused_requests += 1
            counts.refused_attempts += record.refused
        verdict = blame(record, kills)
        if verdict == OK:
            counts.ok += 1
        elif verdict == OTHER:
            counts.other[record.outcome] += 1
        else:
            counts.excused[verdict] += 1
    return counts


@dataclass
class RoundResult:
    number: int
    fault: Fault
    pid: int  # the process signalled
    began: float  # monotonic: the round's requests are those started from here
    converged_s: float | None  # from the fault's end (kill, or SIGCONT); None: never
    replicas_before: list[str]
    replicas_after: list[str]
    engines_before: dict[str, str]  # replica -> engine identity (pid@start time)
    engines_after: dict[str, str]
    killed_replica: str | None = None  # the replica whose engine this round SIGKILLed
    double_booked: list[str] = field(default_factory=list)  # seen at any sample of the round
    duplicated: list[str] = field(default_factory=list)
    waiting_on: list[str] = field(default_factory=list)  # why it had not converged, if not
    requests: RequestCounts = field(default_factory=RequestCounts)

    @property
    def lost(self) -> list[str]:
        return sorted(set(self.replicas_before) - set(self.replicas_after))

    @property
    def new(self) -> list[str]:
        return sorted(set(self.replicas_after) - set(self.replicas_before))

    @property
    def restarts(self) -> tuple[list[str], list[str]]:
        return engine_changes(self.engines_before, self.engines_after, self.killed_replica)


def split_by_round(
    records: Sequence[RequestRecord], starts: Sequence[float]
) -> list[list[RequestRecord]]:
    """Records by the round they ended in (starts ascending): the end is when the outcome is
    known, so a request in flight when a round's kill came counts in that round even if it
    was sent just before the round began. Before the first round: the warm-up, dropped from
    the rounds, still in the totals."""
    rounds: list[list[RequestRecord]] = [[] for _ in starts]
    for record in records:
        index = sum(1 for s in starts if s <= record.ended) - 1
        if index >= 0:
            rounds[index].append(record)
    return rounds


@dataclass
class Summary:
    seed: int
    rounds: list[RoundResult]
    requests: RequestCounts
    replicas: int

    @property
    def engines_killed(self) -> int:
        return sum(1 for r in self.rounds if r.fault.target == "engine" and r.fault.action == KILL)

    def hard_failures(self) -> list[str]:
        found = []
        if self.requests.failed_other:
            found.append(f"{self.requests.failed_other} request(s) failed other than on a kill")
        for r in self.rounds:
            name = f"round {r.number} ({r.fault.describe()})"
            if r.converged_s is None:
                found.append(f"{name}: did not converge: {'; '.join(r.waiting_on[:SHOWN])}")
            if r.lost:
                found.append(f"{name}: replicas lost {r.lost} (new: {r.new})")
            if r.duplicated:
                found.append(f"{name}: duplicated: {r.duplicated[0]}")
            if r.double_booked:
                found.append(f"{name}: double-booked: {r.double_booked[0]}")
        return found


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def render(summary: Summary) -> str:
    lines = [
        f"## Chaos campaign: {len(summary.rounds)} rounds, seed {summary.seed}, "
        f"{summary.replicas} replicas",
        "",
        "| round | fault | converged after | requests | failed: killed engine / gateway / other "
        "| engine restarts: asked / unwanted | replicas lost / new | double-booked | duplicated |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary.rounds:
        q = r.requests
        asked, unwanted = r.restarts
        which = f" {unwanted}" if unwanted else ""
        lines.append(
            f"| {r.number} | {r.fault.describe()} (pid {r.pid}) | {_seconds(r.converged_s)} "
            f"| {q.sent} | {q.excused['killed engine']} / {q.excused['killed gateway']} / "
            f"{q.failed_other} | {len(asked)} / {len(unwanted)}{which} "
            f"| {len(r.lost)} / {len(r.new)} | {len(r.double_booked)} | {len(r.duplicated)} |"
        )
    t = summary.requests
    converge = [r.converged_s for r in summary.rounds if r.converged_s is not None]
    asked_all = sum(len(r.restarts[0]) for r in summary.rounds)
    unwanted_all = sum(len(r.restarts[1]) for r in summary.rounds)
    lines += [
        "",
        f"- requests: {t.sent} sent, {t.ok} ok; failed in flight on a killed engine "
        f"{t.excused['killed engine']}, on the killed gateway {t.excused['killed gateway']} "
        f"(both allowed); other failures {t.failed_other}{f' {dict(t.other)}' if t.other else ''}",
        f"- refused while the gateway was away, then served: {t.refused_requests} request(s) "
        f"after {t.refused_attempts} refused attempt(s); slowest request {t.slowest_s:.1f} s",
        f"- engines killed {summary.engines_killed}, restarted after their kill {asked_all}, "
        f"restarted unasked {unwanted_all}",
        f"- replicas lost {sum(len(r.lost) for r in summary.rounds)}, "
        f"replaced by new ids {sum(len(r.new) for r in summary.rounds)}, "
        f"duplicated in {sum(1 for r in summary.rounds if r.duplicated)} round(s)",
        f"- double-booked in {sum(1 for r in summary.rounds if r.double_booked)} round(s)",
        "- time to converge: "
        + (f"max {max(converge):.1f} s, " if converge else "")
        + ", ".join(_seconds(r.converged_s) for r in summary.rounds),
    ]
    for r in summary.rounds:
        for kind, problems in (("double-booked", r.double_booked), ("duplicated", r.duplicated)):
            for problem in problems[:SHOWN]:
                lines.append(f"  - round {r.number} {kind}: {problem}")
            if len(problems) > SHOWN:
                lines.append(f"  - round {r.number}: {len(problems) - SHOWN} more {kind}")
    hard = summary.hard_failures()
    lines += ["", "Verdict: " + ("PASS" if not hard else "FAIL")]
    lines += [f"- {h}" for h in hard]
    return "\n".join(lines)
