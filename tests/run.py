"""The test run `make test` (and so CI) performs: every layer of the suite, in one pytest.

PostgreSQL is required here: the store tests would otherwise skip on a machine without it, and
CI would pass having tested one backend of two.
"""

import os
import sys

import pytest

NO_TESTS_COLLECTED = pytest.ExitCode.NO_TESTS_COLLECTED  # 5


def main() -> int:
    os.environ.setdefault("LLMGW_REQUIRE_POSTGRES", "1")
    code = pytest.main(["-p", "no:cacheprovider", "--durations=10", "tests", *sys.argv[1:]])
    if code == NO_TESTS_COLLECTED:
        # A run that tested nothing must not read as a pass (pytest's status 5).
        print("pytest collected no tests: check the paths and -k/-m filters", file=sys.stderr)
        return 1
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
