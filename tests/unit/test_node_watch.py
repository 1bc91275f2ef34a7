"""What the end of a liveness watch says of its node (workflows/node/watch.py classify)."""

from datetime import timedelta

from temporalio.exceptions import ApplicationError, CancelledError, TimeoutError, TimeoutType

from workflows.node.watch import Verdict, classify, heartbeat_timeout

ON_TIME = timedelta(seconds=0.2)
LATE = timedelta(seconds=30)  # the control plane was away that long


def timeout(kind: TimeoutType) -> TimeoutError:
    return TimeoutError("activity timed out", type=kind, last_heartbeat_details=[])


def test_a_watch_that_returned_is_an_agent_heard() -> None:
    assert classify(None, ON_TIME) == Verdict.HEARD


def test_a_heartbeat_timeout_is_a_suspicion_even_after_an_outage() -> None:
    for late in (ON_TIME, LATE):
        assert classify(timeout(TimeoutType.HEARTBEAT), late) == Verdict.SUSPECT
    assert classify(timeout(TimeoutType.START_TO_CLOSE), ON_TIME) == Verdict.SUSPECT


def test_a_watch_nobody_took_is_silence_unless_the_control_plane_was_away() -> None:
    assert classify(timeout(TimeoutType.SCHEDULE_TO_START), ON_TIME) == Verdict.SILENT
    assert classify(timeout(TimeoutType.SCHEDULE_TO_START), LATE) == Verdict.FORGIVEN


def test_an_agent_without_the_watch_heartbeats_with_signals() -> None:
    missing = ApplicationError("not registered on this worker", type="NotFoundError")
    assert classify(missing, ON_TIME) == Verdict.OLD_AGENT


def test_a_stopping_worker_is_heard_and_a_broken_watch_is_an_agent_alive() -> None:
    assert classify(CancelledError("Cancelled"), ON_TIME) == Verdict.HEARD
    shutdown = ApplicationError("Worker is shutting down", type="WorkerShutdown")
    assert classify(shutdown, ON_TIME) == Verdict.HEARD
    assert classify(ApplicationError("boom", type="ValueError"), ON_TIME) == Verdict.FAILED


def test_the_heartbeat_timeout_is_half_the_grace() -> None:
    assert heartbeat_timeout(timedelta(seconds=45)) == timedelta(seconds=22.5)
    assert heartbeat_timeout(timedelta(seconds=0.5)) == timedelta(milliseconds=500)
