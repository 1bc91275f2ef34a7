"""For every test: one that fails while it holds a running llmgw (the `system` fixture) shows
the last lines of each of that llmgw's logs (gateway, agent, control, engines), so a failure
seen once in CI can be read without making it happen again."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from tests.system import System

LINES_PER_LOG = 40


def log_tails(state_dir: Path, lines: int = LINES_PER_LOG) -> str:
    """The last `lines` lines of every *.log under `state_dir`, each under its path."""
    parts = []
    for path in sorted(state_dir.rglob("*.log")):
        tail = path.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"--- {path.relative_to(state_dir)} (last {len(tail)} lines)")
        parts.extend(tail)
    return "\n".join(parts) or f"no logs under {state_dir}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    system = getattr(item, "funcargs", {}).get("system")
    if report.failed and isinstance(system, System):
        report.sections.append(("llmgw logs", log_tails(system.state_dir)))
    return report


# `make test` runs the suite on several pytest-xdist workers (tests/run.py). Whole files go to a
# worker, so a module-scoped fixture (a running llmgw, a real llama-server) starts once; and the
# e2e files count as one, so at most one real engine computes beside the rest of the suite, as a
# serial run had it. A scheduler of our own: xdist's `loadgroup` marks do not reach its
# scheduler under pytest 9 (xdist 3.8 renames `item._nodeid`, which pytest 9 no longer reads).
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadFileScheduling

    # xdist ships no type hints, so its scheduler is Any to mypy.
    class FilesWithE2eTogether(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "tests/e2e" if path.startswith("tests/e2e/") else path

    return FilesWithE2eTogether(config, log)


# Files marked `long` (minutes each) are handed to workers first, so none of them starts last
# and ends the run alone while the other workers idle: the 2,100-replica test, begun last, once
# added three and a half minutes to a run. Stable: the order within a file is kept.
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("long") is None)
