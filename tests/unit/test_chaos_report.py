"""The arithmetic of `make chaos`'s report: which failed requests a kill excuses, the counts per
round and in all, and which findings fail the run."""

import httpx

from bench.chaos.load import OK, UNREACHABLE, RequestRecord, outcome_of
from bench.chaos.plan import FREEZE, KILL, Fault
from bench.chaos.report import (
    Kill,
    RoundResult,
    Summary,
    blame,
    count_requests,
    render,
    split_by_round,
)

KILLS = [Kill("engine", 10.0), Kill("agent", 20.0), Kill("gateway", 30.0)]


def req(started: float, ended: float, outcome: str = OK, refused: int = 0) -> RequestRecord:
    return RequestRecord(started, ended, outcome, refused)


def test_only_failures_in_flight_at_an_engine_or_gateway_kill_are_excused() -> None:
    assert blame(req(9, 11, "502 upstream_unreachable"), KILLS) == "killed engine"
    assert blame(req(29, 30, "RemoteProtocolError"), KILLS) == "killed gateway"
    assert blame(req(9, 11), KILLS) == OK
    # Sent after the engine died: the gateway had another replica to try.
    assert blame(req(10.5, 11, "502 upstream_unreachable"), KILLS) == "other"
    # Killing the agent must cost no request.
    assert blame(req(19, 21, "503 no_ready_replica"), KILLS) == "other"
    assert blame(req(40, 100, UNREACHABLE, refused=120), KILLS) == "other"


def test_counts_add_up() -> None:
    records = [
        req(1, 2),
        req(9, 11, "502 upstream_unreachable"),
        req(19, 21, "503 no_ready_replica"),
        req(19, 22, "503 no_ready_replica"),
        req(29, 31, "ReadError"),
        req(30.5, 34, OK, refused=5),
    ]
    counts = count_requests(records, KILLS)
    assert (counts.sent, counts.ok, counts.failed_other) == (6, 2, 2)
    assert counts.excused == {"killed engine": 1, "killed gateway": 1}
    assert counts.other == {"503 no_ready_replica": 2}
    assert (counts.refused_requests, counts.refused_attempts) == (1, 5)
    assert counts.slowest_s == 3.5


def test_requests_belong_to_the_round_they_ended_in() -> None:
    """A request sent just before a round began and failed by its kill is that round's."""
    records = [req(1, 2), req(3, 6), req(12, 19), req(19.5, 21, "ReadError"), req(25, 26)]
    assert split_by_round(records, [4.0, 20.0]) == [
        [req(3, 6), req(12, 19)],
        [req(19.5, 21, "ReadError"), req(25, 26)],
    ]


def round_result(number: int = 1, **changes: object) -> RoundResult:
    result = RoundResult(
        number=number, fault=Fault("engine", KILL), pid=42, began=0.0, converged_s=3.2,
        replicas_before=["m-0", "m-1"], replicas_after=["m-0", "m-1"],
        engines_before={"m-0": "1@1", "m-1": "2@2"}, engines_after={"m-0": "3@3", "m-1": "2@2"},
        killed_replica="m-0",
    )  # fmt: skip
    for name, value in changes.items():
        setattr(result, name, value)
    return result


def summary(*rounds: RoundResult, records: list[RequestRecord] | None = None) -> Summary:
    return Summary(7, list(rounds), count_requests(records or [], KILLS), replicas=2)


def test_a_clean_run_passes_and_says_what_it_measured() -> None:
    clean = summary(round_result(), records=[req(1, 2), req(9, 11, "502 upstream_unreachable")])
    assert clean.hard_failures() == []
    assert clean.engines_killed == 1
    assert round_result().restarts == (["m-0"], [])
    text = render(clean)
    assert "| 1 | kill engine (pid 42) | 3.2 s | 0 | 0 / 0 / 0 | 1 / 0 | 0 / 0 | 0 | 0 |" in text
    assert "2 sent, 1 ok; failed in flight on a killed engine 1" in text
    assert "engines killed 1, restarted after their kill 1, restarted unasked 0" in text
    assert text.endswith("Verdict: PASS")


def test_each_hard_invariant_fails_the_run() -> None:
    lost = round_result(replicas_after=["m-1", "m-2"], engines_after={"m-1": "2@2"})
    assert lost.lost == ["m-0"]
    assert lost.new == ["m-2"]
    never = round_result(converged_s=None, waiting_on=["1 of 2 replicas ready"])
    booked = round_result(double_booked=["GPU 0 on n held 2 times: ['a', 'b']"])
    twice = round_result(duplicated=["3 engine processes for 2 replicas: [1, 2, 3]"])
    for bad in (lost, never, booked, twice):
        assert len(summary(bad).hard_failures()) == 1, bad
        assert render(summary(bad)).splitlines()[-2] == "Verdict: FAIL"
    failed = summary(round_result(), records=[req(19, 21, "503 no_ready_replica")])
    assert failed.hard_failures() == ["1 request(s) failed other than on a kill"]


def test_an_unwanted_restart_is_reported_but_not_a_hard_failure() -> None:
    frozen = round_result(
        fault=Fault("engine", FREEZE, 30.0), killed_replica=None, converged_s=12.0
    )
    assert frozen.restarts == ([], ["m-0"])
    assert summary(frozen).hard_failures() == []
    assert "restarted unasked 1" in render(summary(frozen))


def test_outcome_of_an_answer() -> None:
    ok = httpx.Response(200, json={"choices": [{"message": {"content": "hi"}}]})
    assert outcome_of(ok) == OK
    assert outcome_of(httpx.Response(200, json={})) == "200 without choices"
    gone = {"error": {"message": "x", "type": "server_error", "code": "upstream_unreachable"}}
    assert outcome_of(httpx.Response(502, json=gone)) == "502 upstream_unreachable"
    assert outcome_of(httpx.Response(502, text="<html>")) == "502 not json"
