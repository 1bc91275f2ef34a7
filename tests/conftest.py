"""For every test: one that fails while it holds a running llmgw (the `system` fixture) shows
the last lines of each of that llmgw's logs (gateway, agent, control, engines), so a failure
seen once in CI can be read without making it happen again."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

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


# `make test` runs the suite on several pytest-xdist workers (tests/run.py) with --dist
# loadgroup. A module's tests stay on one worker, so a module-scoped fixture (a running llmgw,
# a real llama-server) is started once; the e2e modules share one worker, so at most one real
# llama-server is busy computing beside the rest of the suite and its timings stay as serial
# runs saw them.
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.path))
        group = "e2e" if path.parent.name == "e2e" else str(path)
        item.add_marker(pytest.mark.xdist_group(group))
