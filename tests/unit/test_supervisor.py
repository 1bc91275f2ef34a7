"""The shard supervisor with small real processes: what an operator would see on the node."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from activities.agent import procfs
from activities.agent.supervisor import ShardSupervisor
from engines.adapter import KvPublisher
from tests.processes import pids_with_token
from workflows.contracts import LaunchResult

SLEEPER = "import time, sys; print('engine up', flush=True); time.sleep(300)"


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def gone(pid: int) -> bool:
    stat = procfs.read_stat(pid)
    return stat is None or not stat.running


def sleeper(token: str) -> list[str]:
    # The token rides along in argv so the test can count processes by it.
    return [sys.executable, "-c", SLEEPER, token]


def launch(
    sup: ShardSupervisor, replica: str, command: list[str], fingerprint: str = "fp1"
) -> LaunchResult:
    return sup.launch(
        replica, f"replica:{replica}", command, {"PATH": "/usr/bin:/bin"}, fingerprint, 18001
    )


def test_launch_runs_detached_and_records_a_spec(
    supervisor: ShardSupervisor, dirs: tuple[Path, Path]
) -> None:
    token = uuid.uuid4().hex
    result = launch(supervisor, "m-0", sleeper(token))
    assert not result.adopted
    assert result.command[-1] == token
    # Its own session and group: a signal to the agent's group does not reach it.
    assert os.getsid(result.pid) == result.pid
    assert os.getpgid(result.pid) == result.pid
    spec = json.loads((dirs[0] / "m-0.json").read_text())
    assert spec["pid"] == result.pid
    assert spec["start_time"] == procfs.start_time(result.pid)
    assert spec["workflow_id"] == "replica:m-0"
    assert spec["fingerprint"] == "fp1"
    assert spec["port"] == 18001
    assert supervisor.is_alive("m-0")
    assert wait_until(lambda: "engine up" in supervisor.log_tail("m-0"))


def test_engine_sees_only_the_environment_it_is_given(supervisor: ShardSupervisor) -> None:
    os.environ["LLMGW_TEST_AGENT_ONLY"] = "leak"
    try:
        code = (
            "import os, time; print('key=' + os.environ.get('LLAMA_API_KEY', '-'),"
            " 'leak=' + os.environ.get('LLMGW_TEST_AGENT_ONLY', '-'), flush=True); time.sleep(300)"
        )
        supervisor.launch(
            "env-0", "wf", [sys.executable, "-c", code], {"LLAMA_API_KEY": "k1"}, "fp", 1
        )
        assert wait_until(lambda: "key=k1 leak=-" in supervisor.log_tail("env-0"))
    finally:
        del os.environ["LLMGW_TEST_AGENT_ONLY"]


def test_second_launch_adopts_instead_of_starting_another(supervisor: ShardSupervisor) -> None:
    token = uuid.uuid4().hex
    first = launch(supervisor, "m-0", sleeper(token))
    second = launch(supervisor, "m-0", sleeper(token))
    assert second.adopted
    assert second.pid == first.pid
    assert pids_with_token(token) == [first.pid]


def test_restarted_agent_adopts_the_running_engine(dirs: tuple[Path, Path]) -> None:
    token = uuid.uuid4().hex
    before = ShardSupervisor(*dirs)
    first = launch(before, "m-0", sleeper(token))
    after = ShardSupervisor(*dirs)  # a new agent process on the same state directory
    try:
        again = launch(after, "m-0", sleeper(token))
        assert again.adopted
        assert again.pid == first.pid
        assert pids_with_token(token) == [first.pid]
        assert [s.replica_id for s in after.shards()] == ["m-0"]
        assert after.dead_shards() == []
    finally:
        after.stop_all(grace_s=1.0)
        before.stop_all(grace_s=1.0)
    assert pids_with_token(token) == []


def test_the_spec_records_the_kv_publisher_an_adopted_engine_keeps_and_old_specs_lack(
    supervisor: ShardSupervisor, dirs: tuple[Path, Path]
) -> None:
    token = uuid.uuid4().hex
    started = KvPublisher("tcp://127.0.0.1:18500", "tcp://127.0.0.1:18501", "m-0", 16, "0")
    supervisor.launch("m-0", "replica:m-0", sleeper(token), {}, "fp1", 18001, kv_publisher=started)
    elsewhere = KvPublisher("tcp://127.0.0.1:18600", "tcp://127.0.0.1:18601", "m-0", 16, "0")
    again = supervisor.launch(
        "m-0", "replica:m-0", sleeper(token), {}, "fp1", 18001, kv_publisher=elsewhere
    )
    assert again.adopted
    spec = supervisor.read_spec("m-0")
    assert spec is not None
    assert spec.publisher() == started  # what the running engine was started with

    # A spec written before the publisher was recorded still loads, with none.
    path = dirs[0] / "m-0.json"
    record = json.loads(path.read_text())
    del record["kv_publisher"]
    path.write_text(json.dumps(record))
    old = supervisor.read_spec("m-0")
    assert old is not None
    assert old.pid == spec.pid
    assert old.publisher() is None


def test_changed_profile_replaces_the_engine(supervisor: ShardSupervisor) -> None:
    token = uuid.uuid4().hex
    old = launch(supervisor, "m-0", sleeper(token), fingerprint="old")
    new = launch(supervisor, "m-0", sleeper(token), fingerprint="new")
    assert not new.adopted
    assert new.pid != old.pid
    assert wait_until(lambda: gone(old.pid))
    assert pids_with_token(token) == [new.pid]


async def test_killed_engine_is_reported_with_its_signal_and_log(
    supervisor: ShardSupervisor,
) -> None:
    started = launch(supervisor, "m-0", sleeper(uuid.uuid4().hex))
    assert wait_until(lambda: "engine up" in supervisor.log_tail("m-0"))
    beats: list[float] = []
    os.kill(started.pid, signal.SIGKILL)
    ended = await supervisor.wait_exit("m-0", lambda: beats.append(time.monotonic()), 0.05)
    assert ended.exit_code == -signal.SIGKILL
    assert "killed by SIGKILL" in ended.reason
    # The log stays on the node: only an error line would leave it, and there is none.
    assert "engine up" not in ended.model_dump_json()
    assert "engine up" in supervisor.log_tail("m-0")
    assert beats
    # Reaped, not left a zombie.
    assert procfs.read_stat(started.pid) is None
    assert [s.replica_id for s in supervisor.dead_shards()] == ["m-0"]


async def test_engine_exit_code_is_reported(supervisor: ShardSupervisor) -> None:
    code = "import sys; print('error: model file is corrupt', file=sys.stderr); sys.exit(3)"
    launch(supervisor, "m-0", [sys.executable, "-c", code])
    ended = await supervisor.wait_exit("m-0", lambda: None, 0.05)
    assert ended.exit_code == 3
    assert ended.reason.endswith("exited with code 3: error: model file is corrupt")


async def test_adopted_engine_death_is_seen_through_proc(dirs: tuple[Path, Path]) -> None:
    before = ShardSupervisor(*dirs)
    started = launch(before, "m-0", sleeper(uuid.uuid4().hex))
    after = ShardSupervisor(*dirs)
    assert launch(after, "m-0", sleeper("x")).adopted
    os.kill(started.pid, signal.SIGKILL)
    ended = await after.wait_exit("m-0", lambda: None, 0.05)
    # Not this instance's child: it cannot know the code, and says so.
    assert ended.exit_code is None
    assert "exit code unknown" in ended.reason
    before.stop_all(grace_s=1.0)


async def test_wait_exit_without_an_engine_returns_at_once(supervisor: ShardSupervisor) -> None:
    ended = await supervisor.wait_exit("never-started", lambda: None, 0.05)
    assert ended.exit_code is None
    assert "no engine process" in ended.reason


def test_stop_kills_the_engines_whole_group(supervisor: ShardSupervisor, tmp_path: Path) -> None:
    pid_file = tmp_path / "worker.pid"
    # The engine forks a worker that ignores SIGTERM, like a stuck inference worker holding
    # memory after its leader exited.
    code = (
        "import subprocess, sys, time\n"
        "w = subprocess.Popen([sys.executable, '-c', 'import signal, time;"
        " signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(w.pid))\n"
        "time.sleep(300)\n"
    )
    started = launch(supervisor, "m-0", [sys.executable, "-c", code])
    assert wait_until(lambda: pid_file.exists() and pid_file.read_text() != "")
    worker = int(pid_file.read_text())
    assert os.getpgid(worker) == started.pid
    t0 = time.monotonic()
    stopped = supervisor.stop("m-0", grace_s=0.5)
    assert stopped.was_running
    assert gone(started.pid)
    assert wait_until(lambda: gone(worker), 5.0)
    assert time.monotonic() - t0 < 8
    assert supervisor.shards() == []
    assert not supervisor.is_alive("m-0")


def test_stop_of_an_unknown_replica_reports_nothing_running(supervisor: ShardSupervisor) -> None:
    result = supervisor.stop("nothing-here")
    assert result.replica_id == "nothing-here"
    assert not result.was_running


def test_reused_pid_is_never_adopted_nor_signalled(
    supervisor: ShardSupervisor, dirs: tuple[Path, Path]
) -> None:
    # An unrelated process now holds the pid an old spec names (the engine died and the pid
    # was handed out again): same pid, different start time.
    stranger = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True
    )
    try:
        real_start = procfs.start_time(stranger.pid)
        assert real_start is not None
        spec = {
            "replica_id": "m-0",
            "workflow_id": "replica:m:0",
            "pid": stranger.pid,
            "start_time": real_start - 1000,
            "command": ["llama-server"],
            "fingerprint": "fp1",
            "port": 18001,
            "log_path": str(dirs[1] / "m-0.log"),
        }
        (dirs[0] / "m-0.json").write_text(json.dumps(spec))
        assert not supervisor.is_alive("m-0")
        assert [s.replica_id for s in supervisor.dead_shards()] == ["m-0"]
        assert not supervisor.stop("m-0").was_running
        (dirs[0] / "m-0.json").write_text(json.dumps(spec))
        fresh = launch(supervisor, "m-0", sleeper(uuid.uuid4().hex))
        assert not fresh.adopted
        assert fresh.pid != stranger.pid
        assert stranger.poll() is None, "the unrelated process must survive"
    finally:
        stranger.kill()
        stranger.wait()


def test_log_tail_is_bounded(supervisor: ShardSupervisor) -> None:
    code = "print('x' * 100000 + 'THE END', flush=True)"
    launch(supervisor, "m-0", [sys.executable, "-c", code])
    assert wait_until(lambda: "THE END" in supervisor.log_tail("m-0"))
    tail = supervisor.log_tail("m-0", max_bytes=1000)
    assert len(tail) <= 1000
    assert tail.rstrip().endswith("THE END")
