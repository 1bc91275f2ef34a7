"""The control worker's watch for a run its SDK holds stuck (workers/stuck_runs.py), against a real
Temporal dev server: a worker holding a run stuck exits to be started again, and the started one
goes on with the run; a frozen server is not taken for a stuck run."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHandle

from engines.local_port import free_port
from tests.stuck_worker import WEDGE_ON, StuckRunTest
from workers.connect import connect_with_retry
from workers.paths import Locations
from workers.stuck_runs import STUCK_RUN_EXIT, pending_task
from workers.temporal_server import TemporalDevServer

REPO = Path(__file__).resolve().parents[2]
QUEUE = "stuck-runs"
WORKFLOW_ID = "stuck-run-test"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[TemporalDevServer]:
    for attempt in range(3):
        port = free_port()
        dev = TemporalDevServer(tmp_path / "temporal.db", tmp_path / "temporal.log", port, None)
        try:
            dev.start()
            break
        except SystemExit:
            # One of the ports it chose (its own or the server's inner ones) was taken meanwhile.
            if attempt == 2:
                raise
    try:
        yield dev
    finally:
        if dev.process is not None:
            os.kill(dev.process.pid, signal.SIGCONT)
        dev.stop()


async def connected(server: TemporalDevServer, tmp_path: Path) -> Client:
    where = Locations(tmp_path, tmp_path, server.address, "default", None)
    return await connect_with_retry(where)


@contextmanager
def stuck_worker(
    server: TemporalDevServer, log: Path, wedge: bool
) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "LLMGW_TEST_WEDGE": "1" if wedge else "0"}
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.stuck_worker", server.address, QUEUE, WORKFLOW_ID],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "polling" not in log.read_text(errors="replace"):
            assert process.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "the worker did not start polling"
            time.sleep(0.1)
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)


@asynccontextmanager
async def workflow(client: Client) -> AsyncIterator[WorkflowHandle[StuckRunTest, None]]:
    handle = await client.start_workflow(StuckRunTest.run, id=WORKFLOW_ID, task_queue=QUEUE)
    try:
        yield handle
    finally:
        await handle.terminate()


async def test_a_worker_holding_a_run_stuck_exits_and_the_next_one_goes_on(
    server: TemporalDevServer, tmp_path: Path
) -> None:
    client = await connected(server, tmp_path)
    log = tmp_path / "worker.log"
    async with workflow(client) as handle:
        with stuck_worker(server, log, wedge=True) as worker:
            for n in range(1, WEDGE_ON):
                assert await handle.execute_update(StuckRunTest.poke, n) == n
            # Blocks the workflow thread for good: the update is never answered by this worker.
            poke = asyncio.create_task(handle.execute_update(StuckRunTest.poke, WEDGE_ON))
            started = time.monotonic()
            code = await asyncio.to_thread(worker.wait, 60)
            waited = time.monotonic() - started
        output = log.read_text(errors="replace")
        assert code == STUCK_RUN_EXIT, output
        assert f"{WORKFLOW_ID}'s workflow task has been pending for" in output
        # Not before the watch's 5 s of one task pending in every check.
        assert waited >= 5, waited
        assert not poke.done()

        # A worker with nothing cached replays the run and answers the update still waiting.
        with stuck_worker(server, tmp_path / "worker-2.log", wedge=False) as again:
            assert await asyncio.wait_for(poke, 60) == WEDGE_ON
            assert await handle.execute_update(StuckRunTest.poke, WEDGE_ON + 1) == WEDGE_ON + 1
            assert await pending_task(client, WORKFLOW_ID, 10) is None
            assert again.poll() is None


async def test_a_frozen_server_is_not_taken_for_a_stuck_run(
    server: TemporalDevServer, tmp_path: Path
) -> None:
    assert server.process is not None
    client = await connected(server, tmp_path)
    log = tmp_path / "worker.log"
    async with workflow(client) as handle:
        with stuck_worker(server, log, wedge=False) as worker:
            assert await handle.execute_update(StuckRunTest.poke, 1) == 1
            # Twice the watch's 5 s with the server frozen, an update sent just before.
            poke = asyncio.create_task(handle.execute_update(StuckRunTest.poke, 2))
            await asyncio.sleep(0.05)
            os.kill(server.process.pid, signal.SIGSTOP)
            await asyncio.sleep(10)
            os.kill(server.process.pid, signal.SIGCONT)
            assert await asyncio.wait_for(poke, 60) == 2
            # Longer than the watch would need to act on what it saw before the thaw.
            await asyncio.sleep(8)
            assert worker.poll() is None, log.read_text(errors="replace")
            assert await handle.execute_update(StuckRunTest.poke, 3) == 3
