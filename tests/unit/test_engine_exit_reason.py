"""What leaves a node when an engine ends: the exit and one redacted line, never its output."""

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities.agent.exit_reason import MAX_REASON_CHARS, error_line
from activities.agent.supervisor import ShardSupervisor


def test_the_last_error_line_is_kept_and_what_follows_a_prompt_or_quote_is_cut() -> None:
    log = "\n".join(
        [
            "loading model",
            "ERROR: first problem",
            "INFO: request 17 prompt='my bank password is hunter2'",
            "ValueError: could not tokenize prompt: 'my bank password is hunter2'",
            "shutting down",
        ]
    )
    assert error_line(log) == "ValueError: could not tokenize [...]"
    assert "hunter2" not in error_line(log)
    assert error_line('RuntimeError: bad token in "tell me a secret"') == (
        "RuntimeError: bad token in [...]"
    )


def test_no_error_line_says_nothing_and_long_lines_are_capped() -> None:
    assert error_line("loading\nlistening on 18000\n") == ""
    line = error_line("CUDA error: " + "x" * 1000)
    assert line.startswith("CUDA error: xxx")
    assert len(line) <= MAX_REASON_CHARS
    assert error_line("\x1b[31mfatal: out of memory\x1b[0m\r") == "fatal: out of memory"


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[ShardSupervisor]:
    sup = ShardSupervisor(tmp_path / "shards", tmp_path / "logs")
    yield sup
    sup.stop_all(grace_s=1.0)


async def test_a_crash_reports_its_error_line_and_keeps_the_prompt_on_the_node(
    supervisor: ShardSupervisor,
) -> None:
    code = (
        "import sys\n"
        "print('request 3: prompt=\"the launch codes are 0000\"', flush=True)\n"
        "print('RuntimeError: CUDA out of memory while serving prompt \"the launch codes\"',"
        " file=sys.stderr)\n"
        "sys.exit(1)\n"
    )
    supervisor.launch("m-0", "wf", [sys.executable, "-c", code], {}, "fp", 18001)
    ended = await supervisor.wait_exit("m-0", lambda: None, 0.05)
    assert ended.exit_code == 1
    assert ended.reason.endswith(": RuntimeError: CUDA out of memory while serving [...]")
    wire = ended.model_dump_json()
    assert "launch codes" not in wire
    assert "log_tail" not in wire
    assert "launch codes" in supervisor.log_tail("m-0")  # still on the node, for an operator


def test_the_first_exception_is_the_cause_when_later_ones_say_see_above() -> None:
    """vLLM's API server logs its engine core's exception, then its own: the first one is
    what went wrong."""
    log = "\n".join(
        [
            "(EngineCore pid=7) ERROR 12-03 06:50:01 [core.py:708] EngineCore failed to start.",
            "(EngineCore pid=7) ERROR 12-03 06:50:01 [core.py:708] Traceback (most recent call):",
            "(EngineCore pid=7) ERROR 12-03 06:50:01 [core.py:708]     raise ValueError(",
            "(EngineCore pid=7) ERROR 12-03 06:50:01 [core.py:708] ValueError: not enough KV"
            " cache memory for 2048 tokens",
            "Traceback (most recent call last):",
            "    raise RuntimeError(",
            "RuntimeError: Engine core initialization failed. See root cause above.",
            "resource_tracker: There appear to be 2 leaked shared_memory objects",
        ]
    )
    assert error_line(log) == (
        "(EngineCore pid=7) ERROR 12-03 06:50:01 [core.py:708] ValueError: not enough KV cache"
        " memory for 2048 tokens"
    )


def test_a_failure_is_explained_from_the_latest_run_only(supervisor: ShardSupervisor) -> None:
    """The log keeps earlier runs; an old run's exception is not this run's cause."""
    old = "import sys; print('KeyError: an old crash', file=sys.stderr); sys.exit(1)"
    new = "import sys; print('fatal: out of memory', file=sys.stderr); sys.exit(1)"
    for code in (old, new):
        supervisor.launch("m-1", "wf", [sys.executable, "-c", code], {}, "fp", 18002)
        wait_until_dead(supervisor, "m-1")
    assert "an old crash" in supervisor.log_tail("m-1")
    assert supervisor.failure_line("m-1") == "fatal: out of memory"


def wait_until_dead(supervisor: ShardSupervisor, replica: str) -> None:
    deadline = time.monotonic() + 10
    while supervisor.is_alive(replica):
        assert time.monotonic() < deadline, f"{replica} still running"
        time.sleep(0.02)
