"""Work requests start and do not wait for: bounded, failures logged, cancelled at shutdown."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gateway.side_tasks import SideTasks


async def test_past_the_limit_work_is_not_started_and_close_cancels_the_rest() -> None:
    tasks = SideTasks(limit=2)
    release = asyncio.Event()
    started: list[int] = []
    cancelled: list[int] = []

    async def work(n: int) -> None:
        started.append(n)
        try:
            await release.wait()
        except asyncio.CancelledError:
            cancelled.append(n)
            raise

    assert tasks.start(lambda: work(1), "one")
    assert tasks.start(lambda: work(2), "two")
    assert not tasks.start(lambda: work(3), "three")
    await asyncio.sleep(0)
    assert started == [1, 2]
    assert len(tasks) == 2
    await tasks.close()
    assert sorted(cancelled) == [1, 2]
    assert len(tasks) == 0
    assert tasks.start(lambda: work(4), "four"), "room again once they ended"
    release.set()
    await asyncio.sleep(0.01)
    assert started == [1, 2, 4]
    assert len(tasks) == 0


async def test_a_failure_is_logged_and_frees_its_place(caplog: pytest.LogCaptureFixture) -> None:
    tasks = SideTasks(limit=1)

    async def fails() -> None:
        raise RuntimeError("engine gone")

    with caplog.at_level(logging.ERROR, logger="gateway.side_tasks"):
        assert tasks.start(fails, "learn leading tokens")
        await asyncio.sleep(0.01)
    assert "learn leading tokens failed" in caplog.text
    assert len(tasks) == 0
