"""One engine per replica, whatever the retries: concurrent launches, and a launch after one
that died half-way, with small real processes."""

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from activities.agent import procfs
from activities.agent.supervisor import LAUNCH_ID_ENV, ShardSupervisor
from tests.processes import pids_with_token
from tests.unit.test_supervisor import sleeper
from workflows.contracts import LaunchResult


def launch(sup: ShardSupervisor, command: list[str]) -> LaunchResult:
    return sup.launch("m-0", "replica:m:0", command, {"PATH": "/usr/bin:/bin"}, "fp1", 18001)


def test_two_concurrent_launches_of_one_replica_start_one_engine(dirs: tuple[Path, Path]) -> None:
    # Two agents' worth of supervisors (or a timed-out attempt still in its thread and its
    # retry) launching the same replica at the same moment.
    token = uuid.uuid4().hex
    sups = [ShardSupervisor(*dirs), ShardSupervisor(*dirs)]
    start = threading.Barrier(len(sups))
    results: list[LaunchResult] = []
    errors: list[BaseException] = []

    def attempt(sup: ShardSupervisor) -> None:
        start.wait()
        try:
            results.append(launch(sup, sleeper(token)))
        except BaseException as err:  # noqa: BLE001 - a thread's error, kept for the assert
            errors.append(err)

    threads = [threading.Thread(target=attempt, args=(s,)) for s in sups]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == []
        assert len(pids_with_token(token)) == 1
        assert sorted(r.adopted for r in results) == [False, True]
        assert results[0].pid == results[1].pid == pids_with_token(token)[0]
    finally:
        for sup in sups:
            sup.stop_all(grace_s=1.0)
    assert pids_with_token(token) == []


def launching_record(dirs: tuple[Path, Path], launch_id: str, token: str) -> None:
    """What an agent killed between writing the record and recording the pid leaves."""
    dirs[0].mkdir(parents=True, exist_ok=True)
    spec = {
        "replica_id": "m-0",
        "workflow_id": "replica:m:0",
        "pid": 0,
        "start_time": 0,
        "command": sleeper(token),
        "fingerprint": "fp1",
        "port": 18001,
        "log_path": str(dirs[1] / "m-0.log"),
        "phase": "launching",
        "launch_id": launch_id,
    }
    (dirs[0] / "m-0.json").write_text(json.dumps(spec))


def exec_done(pid: int, launch_id: str) -> None:
    mark = f"{LAUNCH_ID_ENV}={launch_id}".encode()
    deadline = time.monotonic() + 10
    while mark not in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        assert time.monotonic() < deadline, "the orphan never started"
        time.sleep(0.01)


def test_launch_after_one_that_died_before_recording_the_pid_adopts_its_engine(
    supervisor: ShardSupervisor, dirs: tuple[Path, Path]
) -> None:
    token, launch_id = uuid.uuid4().hex, uuid.uuid4().hex
    launching_record(dirs, launch_id, token)
    # The engine that attempt did start, as the supervisor starts one: own session, the id in
    # its environment.
    orphan = subprocess.Popen(
        sleeper(token),
        env={LAUNCH_ID_ENV: launch_id, "PATH": "/usr/bin:/bin"},
        start_new_session=True,
    )
    try:
        # As an orphan found later would be: exec'd, its environment its own (between fork
        # and exec /proc shows the parent's, which has no launch id).
        exec_done(orphan.pid, launch_id)
        again = launch(supervisor, sleeper(token))
        assert again.adopted
        assert again.pid == orphan.pid
        assert pids_with_token(token) == [orphan.pid]
        spec = supervisor.read_spec("m-0")
        assert spec is not None
        assert not spec.launching
        assert (spec.pid, spec.start_time) == (orphan.pid, procfs.start_time(orphan.pid))
        assert supervisor.is_alive("m-0")
        assert supervisor.stop("m-0", grace_s=1.0).was_running
        assert orphan.wait(5) is not None
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()


def test_launch_after_one_that_died_before_starting_anything_starts_one(
    supervisor: ShardSupervisor, dirs: tuple[Path, Path]
) -> None:
    token = uuid.uuid4().hex
    launching_record(dirs, uuid.uuid4().hex, token)
    assert supervisor.dead_shards() == []  # settled: nothing ran, nothing to report
    assert supervisor.read_spec("m-0") is None
    launching_record(dirs, uuid.uuid4().hex, token)
    started = launch(supervisor, sleeper(token))
    assert not started.adopted
    assert pids_with_token(token) == [started.pid]


def test_a_completed_launch_is_adopted_by_the_next_agent(dirs: tuple[Path, Path]) -> None:
    token = uuid.uuid4().hex
    first = launch(ShardSupervisor(*dirs), sleeper(token))  # its agent then dies
    after = ShardSupervisor(*dirs)
    try:
        again = launch(after, sleeper(token))
        assert again.adopted
        assert again.pid == first.pid
        assert pids_with_token(token) == [first.pid]
    finally:
        after.stop_all(grace_s=1.0)


def test_the_record_is_on_disk_before_the_engine_runs(
    supervisor: ShardSupervisor, dirs: tuple[Path, Path], tmp_path: Path
) -> None:
    # The engine reads its own replica's spec as its first act: it must already be there,
    # naming the launch id the engine was given.
    seen = tmp_path / "seen.json"
    code = (
        "import os, sys, time\n"
        f"spec = open({str(dirs[0] / 'm-0.json')!r}).read()\n"
        f"open({str(seen)!r}, 'w').write(spec + '\\n' + os.environ['{LAUNCH_ID_ENV}'])\n"
        "time.sleep(300)\n"
    )
    launch(supervisor, [sys.executable, "-c", code])
    for _ in range(200):
        if seen.exists() and seen.read_text().count("\n") >= 1:
            break
        threading.Event().wait(0.05)
    text, _, launch_id = seen.read_text().rpartition("\n")
    assert json.loads(text)["launch_id"] == launch_id != ""


def test_a_start_that_fails_leaves_no_record(supervisor: ShardSupervisor, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        launch(supervisor, [str(tmp_path / "no-such-engine")])
    assert supervisor.shards() == []
    assert os.listdir(supervisor.log_path("m-0").parent) == ["m-0.log"]
