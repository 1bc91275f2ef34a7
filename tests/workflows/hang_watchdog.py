"""The workflow tests' watchdog: a test still running after HANG_S fails with the stack of every
task on its loop, rather than hanging the run (tests/workflows/conftest.py imports the hook)."""

import asyncio
import functools
import os
import signal
import sys
from collections.abc import Generator

import pytest

# A workflow test awaiting what never comes would hold the whole run until CI's time limit (seen
# once: the forced continue-as-new pass idle for 25 minutes in test_node_liveness's restart test,
# its time-skipping server idle too). After HANG_S the watchdog prints the stack of every task
# on the test's loop and cancels the test's own: it fails, with those stacks in its report.
HANG_S = int(os.environ.get("LLMGW_TEST_HANG_S", "600"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    previous = signal.signal(signal.SIGALRM, functools.partial(_hung, item.name))
    signal.alarm(HANG_S)
    try:
        return (yield)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _hung(test: str, _signum: int, _frame: object) -> None:
    # A signal handler runs in the main thread, where the test's loop runs.
    loop = asyncio._get_running_loop()
    print(f"\n{test} still running after {HANG_S} s; its loop's tasks:", file=sys.stderr)
    if loop is None:
        raise TimeoutError(f"{test} still running after {HANG_S} s, outside an event loop")
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.print_stack(file=sys.stderr)
    name = test.partition("[")[0]
    for task in tasks:
        if getattr(task.get_coro(), "__name__", None) == name:
            # Thread-safe: it wakes the loop out of its wait, which a plain cancel would not.
            loop.call_soon_threadsafe(task.cancel, f"still running after {HANG_S} s")
