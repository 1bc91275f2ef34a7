"""The background loops the gateway's lifespan owns must keep going through failures and must
stop when told, or shutdown hangs."""

from __future__ import annotations

import asyncio
import contextlib

from gateway.loops import PeriodicTask


async def test_a_failing_step_does_not_end_the_loop() -> None:
    calls = 0

    async def step() -> None:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionError("store down")

    task = PeriodicTask("t", 0.01, step)
    task.start()
    async with asyncio.timeout(2):
        while calls < 5:
            await asyncio.sleep(0.01)
    await task.stop()


async def test_stop_ends_a_loop_whose_step_swallows_cancellation() -> None:
    # Python 3.11's asyncio.wait_for, for one, can eat a cancel that arrives as it completes.
    async def stubborn() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.05)

    task = PeriodicTask("t", 0.001, stubborn)
    task.start()
    await asyncio.sleep(0.02)
    # Waited on from the side, so a regression fails here instead of hanging the run.
    stopper = asyncio.create_task(task.stop())
    done, _ = await asyncio.wait([stopper], timeout=2)
    assert done, "stop() never returned"
