"""A worker whose SDK holds a run stuck, for tests/workflows/test_stuck_runs.py: run as
`python -m tests.stuck_worker ADDRESS TASK_QUEUE WORKFLOW_ID`, with the control worker's watch
(workers/stuck_runs.py) on that one workflow, checking every second.

With LLMGW_TEST_WEDGE=1 the `poke` update named WEDGE_ON blocks its workflow thread for good, the
way an activation the SDK can never finish does: the SDK's deadlock detector fails it, and the
run stays in this worker's cache, unable to be evicted. Started again without it, a worker
replays the run and goes on."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading

from temporalio import workflow
from temporalio.worker import Worker

from workers.stuck_runs import WatchSettings, exit_when_a_run_is_stuck
from workflows.client import connect

WEDGE = os.environ.get("LLMGW_TEST_WEDGE") == "1"
WEDGE_ON = 3
SETTINGS = WatchSettings(check_every_s=1.0, stuck_after_s=5.0)


@workflow.defn(name="StuckRunTest", sandboxed=False)
class StuckRunTest:
    def __init__(self) -> None:
        self.pokes = 0

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.update
    def poke(self, n: int) -> int:
        if WEDGE and n == WEDGE_ON and not workflow.unsafe.is_replaying():
            threading.Event().wait()
        self.pokes += 1
        return self.pokes


async def main(address: str, task_queue: str, workflow_id: str) -> None:
    logging.basicConfig(level=logging.INFO)
    client = await connect(address)

    async def watched() -> list[str]:
        return [workflow_id]

    async with Worker(client, task_queue=task_queue, workflows=[StuckRunTest]):
        print("polling", flush=True)
        await exit_when_a_run_is_stuck(client, watched, SETTINGS)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
