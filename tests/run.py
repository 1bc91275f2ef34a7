"""The test run `make test` (and so CI) performs: every layer of the suite in one pytest and,
beside it, the workflow suite again with continue-as-new forced every few events
(LLMGW_TEST_FORCED_PASS=0 skips that second pass).

PostgreSQL is required here: the store tests would otherwise skip on a machine without it, and
CI would pass having tested one backend of two. Run as root (as CI is), so are network
namespaces, for the multi-host test (tests/integration/test_multi_host.py).

The second pass is the proof that no workflow loses state or pending work to continue-as-new:
with LLMGW_TEST_CONTINUE_AS_NEW_EVERY every long-lived workflow continues at each safe point
past that many events, so each test crosses many runs. It runs in a process of its own, since
the knob is read when a workflow run starts. The time-skipping test server holds a query, or a
wait for a result, to a workflow between two runs until its own deadline: the workflow tests
ask again (tests/workflows/conftest.py: ask, eventually, finished) rather than wait on one.
"""

import os
import subprocess
import sys
import tempfile

import pytest

NO_TESTS_COLLECTED = pytest.ExitCode.NO_TESTS_COLLECTED  # 5
FORCED_CONTINUE_AS_NEW_EVERY = "40"


def workers() -> str:
    """How many pytest-xdist workers: LLMGW_TEST_WORKERS, else one more than the cores (at
    least 3, at most 8): with one a core, a fresh-clone run here kept the 2 cores busy only half
    its time (the fault tests sleep through outages, engines start, timers run in real time).
    Twice the cores finished sooner still but made the timing-bound integration tests miss more
    often. 0 runs in one process."""
    default = min(8, max(3, (os.cpu_count() or 1) + 1))
    return os.environ.get("LLMGW_TEST_WORKERS", str(default))


def spread() -> list[str]:
    """pytest's arguments for the workers; tests/conftest.py sends whole files to a worker."""
    count = workers()
    return [] if count == "0" else ["-n", count, "--dist", "loadfile"]


class ForcedPass:
    """The workflow suite with continue-as-new forced, run beside the first pass in a process
    of its own (one worker: it mostly waits on Temporal servers of its own, and alone takes
    less time than the first pass on all of them). Its output goes to a file, printed after
    the first pass so the two do not interleave."""

    def __init__(self) -> None:
        env = {**os.environ, "LLMGW_TEST_CONTINUE_AS_NEW_EVERY": FORCED_CONTINUE_AS_NEW_EVERY}
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"]
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in finish()
        self.process = subprocess.Popen(
            [*command, "tests/workflows"], env=env, stdout=self.log, stderr=subprocess.STDOUT
        )

    def finish(self) -> int:
        code = self.process.wait()
        self.log.seek(0)
        print("\nThe workflow suite again, continuing as new every few events:", flush=True)
        sys.stdout.buffer.write(self.log.read())
        sys.stdout.flush()
        self.log.close()
        return code


def main() -> int:
    os.environ.setdefault("LLMGW_REQUIRE_POSTGRES", "1")
    if os.geteuid() == 0:
        # Root can make network namespaces: the multi-host test must run, not skip.
        os.environ.setdefault("LLMGW_REQUIRE_NETNS", "1")
    args = sys.argv[1:]
    # A filtered run (make test ARGS=...) is someone looking at a few tests: one pass.
    forced = None if args or os.environ.get("LLMGW_TEST_FORCED_PASS") == "0" else ForcedPass()
    code = pytest.main(["-p", "no:cacheprovider", "--durations=10", *spread(), "tests", *args])
    if forced is not None:
        forced_code = forced.finish()  # waited for and shown even when the first pass failed
        code = code or forced_code
    if code == NO_TESTS_COLLECTED:
        # A run that tested nothing must not read as a pass (pytest's status 5).
        print("pytest collected no tests: check the paths and -k/-m filters", file=sys.stderr)
        return 1
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
