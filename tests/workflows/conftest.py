"""Workflow tests: the time-skipping test server, the real ledger, a stand-in node agent."""

import asyncio
import contextlib
import json
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.ledger_calls import update_ledger
from tests.workflows.fake_agent import FakeAgent
from workers.control import control_activities, ensure_ledger
from workers.progress import ledger_snapshot
from workers.registry import CONTROL_WORKFLOWS
from workers.search_attributes import ensure_search_attributes
from workflows import history_budget
from workflows.contracts import (
    EngineState,
    EngineStatus,
    LedgerAck,
    LedgerState,
    NodeInventory,
    NodeRecord,
    NodeState,
    Route,
)
from workflows.names import CONTROL_TASK_QUEUE, node_task_queue

HISTORIES = Path(__file__).parent / "histories"
# Set to a new era's name (e.g. 2027-01) to store this run's histories beside the older ones
# for the replay tests: see test_replay.py.
RECORD_ERA = os.environ.get("LLMGW_RECORD_HISTORIES", "")
CONTINUE_AS_NEW_EVERY = "LLMGW_TEST_CONTINUE_AS_NEW_EVERY"


def binary(name: str) -> str:
    path = shutil.which(name) or str(Path(__file__).parents[2] / ".venv" / "bin" / name)
    assert Path(path).exists(), f"{name} not found: install the dev extras"
    return path


@pytest.fixture(scope="session")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    environment = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=binary("temporal-test-server"),
        data_converter=pydantic_data_converter,
    )
    yield environment
    await environment.shutdown()


@pytest.fixture(scope="session")
def server_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The control worker's configuration file; a test may rewrite it (it is read on every
    call) and must put back the default, which is an empty file."""
    path = tmp_path_factory.mktemp("config") / "llmgw.yaml"
    path.write_text("")
    return path


@pytest.fixture(scope="session")
async def control_worker(env: WorkflowEnvironment, server_config: Path) -> AsyncIterator[Worker]:
    """One control worker for the session: the ledger is one long-lived workflow, as in
    production, and a worker per test would leave it waiting on a dead worker's sticky queue."""
    worker = Worker(
        env.client,
        task_queue=CONTROL_TASK_QUEUE,
        workflows=CONTROL_WORKFLOWS,
        activities=control_activities(env.client, server_config),
    )
    async with worker:
        # The ledger exists before any test looks at it, as it does once `llmgw up` has run.
        await ensure_search_attributes(env.client)
        await ensure_ledger(env.client)
        yield worker


@pytest.fixture
async def cluster(env: WorkflowEnvironment, control_worker: Worker) -> AsyncIterator["Cluster"]:
    """A stand-in agent for a node of this test's own, beside the session's control worker."""
    node = unique("n1")
    agent = FakeAgent(node)
    async with Worker(env.client, task_queue=node_task_queue(node), activities=agent.all()):
        cluster = Cluster(env.client, node, agent)
        yield cluster
        await cluster.close()


class Cluster:
    def __init__(self, client: Client, node: str, agent: FakeAgent) -> None:
        self.client = client
        self.node = node
        self.agent = agent
        self.started: list[WorkflowHandle[Any, Any]] = []

    async def add_node(self, cores: int = 8, engine_state: EngineState = EngineState.INSTALLED):
        record = NodeRecord(
            inventory=NodeInventory(name=self.node, cpu_cores=cores, memory_mb=16384),
            state=NodeState.READY,
            engines={
                "llamacpp": EngineStatus(
                    engine="llamacpp", version="1", state=engine_state, path="/x/llama-server"
                )
            },
        )
        await update_ledger(self.client, "upsert_node", record, LedgerAck)

    async def ledger(self) -> LedgerState:
        return await ledger_snapshot(self.client)

    async def route(self, replica: str) -> Route | None:
        return (await self.ledger()).routes.get(replica)

    async def start(self, workflow: Any, *args: Any, id: str) -> WorkflowHandle[Any, Any]:
        handle = await self.client.start_workflow(
            workflow, *args, id=id, task_queue=CONTROL_TASK_QUEUE
        )
        # Unpinned from the first run: queries, signals and the cleanup's terminate must reach
        # the current run after a continue-as-new (LLMGW_TEST_CONTINUE_AS_NEW_EVERY forces
        # them); result() follows the runs from the first. Kept otherwise as started, as only
        # that handle lets the time-skipping server skip ahead while a test awaits result().
        handle._run_id = None
        self.started.append(handle)
        return handle

    async def close(self) -> None:
        # The ledger outlives each test: take this test's node out of placement, and end what
        # the test left running, so the next test starts from a quiet cluster.
        # Newest first: a model goes before its replicas, so it cannot start one after them.
        for handle in reversed(self.started):
            with contextlib.suppress(Exception):
                await handle.terminate("test over")
        state = await self.ledger()
        if self.node in state.nodes:
            record = state.nodes[self.node]
            record.state = NodeState.LOST
            await update_ledger(self.client, "upsert_node", record, LedgerAck)


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await _answered(check):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {check.__doc__ or check}")
        await asyncio.sleep(0.05)


async def _answered(check: Callable[[], Awaitable[bool]]) -> bool:
    """The check's answer; False while a query cannot be answered yet (the time-skipping server
    times queries out while a workflow is between two runs of a continue-as-new)."""
    try:
        return await check()
    except RPCError:
        return False


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


async def record_history(handle: WorkflowHandle[Any, Any], name: str) -> None:
    """With LLMGW_RECORD_HISTORIES=<era>, store this workflow's history as
    histories/<era>/<name>.json for test_replay.py. Stored histories are append-only: the
    executions they stand for may still be running in someone's cluster, so a file is never
    rewritten, and a behaviour change gets a new era beside the old ones.

    The file is the history as `temporal workflow show --output json` gives it, plus the
    workflow ID (which the history itself does not carry) so the replay sees the same
    `workflow.info()`."""
    if not RECORD_ERA:
        return
    path = HISTORIES / RECORD_ERA / f"{name}.json"
    if path.exists():
        raise FileExistsError(f"{path} is stored already: record into a new era")
    history = await handle.fetch_history()
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "workflow_id": history.workflow_id,
        # A run recorded with continue-as-new forced replays only with the same knob.
        "continue_as_new_every": history_budget.FORCE_EVERY_EVENTS
        or int(os.environ.get(CONTINUE_AS_NEW_EVERY, "0") or 0),
        **history.to_json_dict(),
    }
    path.write_text(json.dumps(document, indent=1) + "\n")
