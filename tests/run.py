"""The test run `make test` (and so CI) performs: every layer of the suite in one pytest, then
the workflow tests again with continue-as-new forced.

PostgreSQL is required here: the store tests would otherwise skip on a machine without it, and
CI would pass having tested one backend of two.
"""

import os
import subprocess
import sys

import pytest

NO_TESTS_COLLECTED = pytest.ExitCode.NO_TESTS_COLLECTED  # 5


# The second pass: every workflow test again with continue-as-new forced every this many
# events, so each workflow's carry path is exercised at every step, not only where a test
# thought to force it. The replay tests stay out: their histories were recorded without it.
FORCED_CONTINUE_AS_NEW_EVERY = "40"
WORKFLOW_TESTS = "tests/workflows"
REPLAY_TESTS = "tests/workflows/test_replay.py"


def run_pytest(args: list[str]) -> int:
    code = pytest.main(["-p", "no:cacheprovider", "--durations=10", *args])
    if code == NO_TESTS_COLLECTED:
        # A run that tested nothing must not read as a pass (pytest's status 5).
        print("pytest collected no tests: check the paths and -k/-m filters", file=sys.stderr)
        return 1
    return int(code)


def main() -> int:
    os.environ.setdefault("LLMGW_REQUIRE_POSTGRES", "1")
    extra = sys.argv[1:]
    code = run_pytest(["tests", *extra])
    if code != 0 or extra:
        return code
    # A subprocess, so the knob is in place before any workflow module is imported.
    env = {**os.environ, "LLMGW_TEST_CONTINUE_AS_NEW_EVERY": FORCED_CONTINUE_AS_NEW_EVERY}
    forced = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", WORKFLOW_TESTS]
    print(f"\nthe workflow tests again, continuing as new every {FORCED_CONTINUE_AS_NEW_EVERY}")
    return subprocess.run([*forced, "--deselect", REPLAY_TESTS], env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
