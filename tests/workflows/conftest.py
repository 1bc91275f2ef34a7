"""Workflow tests: the time-skipping test server, the real fleet tables (a SQLite file), a
stand-in node agent."""

import asyncio
import contextlib
import json
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType as WorkflowEventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, ClientConfig, WorkflowExecutionStatus, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.control.fleet_activities import FleetActivities
from store.fleet import FleetTables, open_fleet
from tests.workflows.fake_agent import FakeAgent
from tests.workflows.hang_watchdog import pytest_runtest_call  # noqa: F401 - a hook
from workers.control import control_activities
from workers.progress import ledger_snapshot
from workers.registry import CONTROL_WORKFLOWS
from workers.search_attributes import ensure_search_attributes
from workflows import history_budget
from workflows.contracts import (
    Allocation,
    EngineState,
    EngineStatus,
    LedgerState,
    NodeInventory,
    NodeRecord,
    NodeState,
    PlacementRefusal,
    PlacementRequest,
    Route,
)
from workflows.names import CONTROL_TASK_QUEUE, artifact_fetch_workflow_id, node_task_queue

HISTORIES = Path(__file__).parent / "histories"
# Set to a new era's name (e.g. 2027-01) to store this run's histories beside the older ones
# for the replay tests: see tests/unit/test_replay.py.
RECORD_ERA = os.environ.get("LLMGW_RECORD_HISTORIES", "")
CONTINUE_AS_NEW_EVERY = "LLMGW_TEST_CONTINUE_AS_NEW_EVERY"


def binary(name: str) -> str:
    path = shutil.which(name) or str(Path(__file__).parents[2] / ".venv" / "bin" / name)
    assert Path(path).exists(), f"{name} not found: install the dev extras"
    return path


# The time-skipping server, the fleet tables and the shared control worker are a test file's
# own. Shared by the whole session, one file's leftovers (workflows still running after their
# test) kept the server from skipping time for every later file: a test whose timers took half a
# second alone took their full length in real time (80 s) after most other files.
@pytest.fixture(scope="module")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    environment = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=binary("temporal-test-server"),
        data_converter=pydantic_data_converter,
    )
    yield environment
    await environment.shutdown()


def control_client(env: WorkflowEnvironment) -> Client:
    """The control activities' client: the environment's, without its time-skipping hook. A
    handle that client starts unlocks time skipping while its result() is awaited, and the
    activity that waits on a node's fetch (activities/control/artifact_fetches.py) awaits one
    for as long as the fetch runs, in real time: the server would jump past every timeout of
    the fetch meanwhile."""
    config = env.client.config()
    kept = [i for i in config["interceptors"] if "TimeSkipping" not in type(i).__name__]
    without_skipping: ClientConfig = {**config, "interceptors": kept}
    return Client(**without_skipping)


@pytest.fixture(scope="module")
def server_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The control worker's configuration file; a test may rewrite it (it is read on every
    call) and must put back the default, which is an empty file."""
    path = tmp_path_factory.mktemp("config") / "llmgw.yaml"
    path.write_text("")
    return path


@pytest.fixture(scope="module")
async def fleet(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FleetTables]:
    """The fleet tables of the test file (a SQLite file), shared by its tests as one cluster's
    store is shared by its control workers."""
    tables = open_fleet(None, tmp_path_factory.mktemp("fleet"))
    await tables.init()
    yield tables
    await tables.close()


@pytest.fixture(scope="module")
async def control_worker(
    env: WorkflowEnvironment, fleet: FleetTables, server_config: Path
) -> AsyncIterator[Worker]:
    """One control worker for the test file on the shared control queue."""
    worker = Worker(
        env.client,
        task_queue=CONTROL_TASK_QUEUE,
        workflows=CONTROL_WORKFLOWS,
        activities=control_activities(control_client(env), fleet, server_config),
    )
    async with worker:
        await ensure_search_attributes(env.client)
        yield worker


@pytest.fixture
async def cluster(
    env: WorkflowEnvironment,
    control_worker: Worker,  # noqa: ARG001 - requested so the shared queue has a worker
    fleet: FleetTables,
    server_config: Path,
) -> AsyncIterator["Cluster"]:
    """A control worker and a stand-in agent for a node, both on queues of this test's own.

    Only the fleet tables are shared, as one cluster's store is. Every workflow a test starts
    runs on the test's control queue (the workflows send their activities and children to
    their own queue), and its node's
    activities on `node:<unique name>`, so no other test's worker takes a task of this one
    and a test that leaves a worker busy slows only itself."""
    async with cluster_on(env.client, control_client(env), fleet, server_config) as made:
        yield made


async def start_dev_server() -> WorkflowEnvironment:
    """A real Temporal dev server of the test's own. The SDK gives it 5 s to start by default,
    which a loaded 2-core machine missed once in `make test`."""
    return await WorkflowEnvironment.start_local(
        dev_server_existing_path=binary("temporal"),
        data_converter=pydantic_data_converter,
        dev_server_startup_timeout=timedelta(seconds=60),
    )


@pytest.fixture
async def dev_cluster(
    server_config: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator["Cluster"]:
    """A cluster as above on a real Temporal dev server of its own, with its own store: for
    a test whose run the time-skipping test server gets wrong. That server can leave a workflow
    task STARTED for good when a completion cancels a timer whose fire it already holds (its
    bug temporalio/sdk-java#3088): a replica told to stop at that moment never closes. Timers
    run in real time here, so such a test waits out every one."""
    env = await start_dev_server()
    fleet = open_fleet(None, tmp_path_factory.mktemp("fleet"))
    try:
        await fleet.init()
        await ensure_search_attributes(env.client)
        async with cluster_on(env.client, env.client, fleet, server_config) as made:
            yield made
    finally:
        await fleet.close()
        await env.shutdown()


@contextlib.asynccontextmanager
async def cluster_on(
    client: Client, activities_client: Client, fleet: FleetTables, server_config: Path
) -> AsyncIterator["Cluster"]:
    node = unique("n1")
    agent = FakeAgent(node)
    queue = unique("control")
    control = Worker(
        client,
        task_queue=queue,
        workflows=CONTROL_WORKFLOWS,
        activities=control_activities(activities_client, fleet, server_config),
    )
    on_node = Worker(client, task_queue=node_task_queue(node), activities=agent.all())
    async with control, on_node:
        cluster = Cluster(client, fleet, node, agent, queue)
        yield cluster
        await cluster.close()


class Cluster:
    def __init__(
        self, client: Client, fleet: FleetTables, node: str, agent: FakeAgent, task_queue: str
    ) -> None:
        self.client = client
        self.fleet = fleet
        self.node = node
        self.agent = agent
        self.task_queue = task_queue  # this test's control queue
        self.started: list[WorkflowHandle[Any, Any]] = []

    async def add_node(
        self,
        cores: int = 8,
        engine_state: EngineState = EngineState.INSTALLED,
        engine: str = "llamacpp",
        version: str = "1",
    ) -> None:
        record = NodeRecord(
            inventory=NodeInventory(name=self.node, cpu_cores=cores, memory_mb=16384),
            state=NodeState.READY,
            engines={
                engine: EngineStatus(
                    engine=engine,
                    version=version,
                    state=engine_state,
                    path="/x/llama-server" if engine == "llamacpp" else f"/x/{engine}",
                )
            },
        )
        await self.fleet.upsert_node(record)

    async def ledger(self) -> LedgerState:
        return await ledger_snapshot(self.fleet)

    async def route(self, replica: str) -> Route | None:
        return (await self.ledger()).routes.get(replica)

    async def place(self, req: PlacementRequest) -> Allocation | PlacementRefusal:
        """Place a replica as a control worker's placement activity does, on the tables as they
        are now (a placer of its own, as another control worker's would be)."""
        return await FleetActivities(self.fleet).place(req)

    async def start(self, workflow: Any, *args: Any, id: str) -> WorkflowHandle[Any, Any]:
        handle = await self.client.start_workflow(
            workflow, *args, id=id, task_queue=self.task_queue
        )
        # Unpinned from the first run: queries, signals and the cleanup's terminate must reach
        # the current run after a continue-as-new (LLMGW_TEST_CONTINUE_AS_NEW_EVERY forces
        # them); result() follows the runs from the first. Kept otherwise as started, as only
        # that handle lets the time-skipping server skip ahead while a test awaits result().
        handle._run_id = None
        self.started.append(handle)
        return handle

    async def close(self) -> None:
        # The fleet tables outlive each test: take this test's node out of placement, and end what
        # the test left running, so the next test starts from a quiet cluster. Children too:
        # one left running on this test's queue, which no worker polls once the test is over,
        # would hold a workflow task open for good, and the time-skipping server skips no
        # time while any task is open: every later test's timers would run in real time.
        # Newest first, parents before children: a model cannot start a replica after them.
        pending = [handle.id for handle in reversed(self.started)]
        # The node's fetches (ArtifactFetch workflows, started by a control activity rather than
        # as children) after the replicas that waited on them.
        pending += [artifact_fetch_workflow_id(self.node, m) for m in set(self.agent.fetches)]
        ended: set[str] = set()
        while pending:
            workflow_id = pending.pop(0)
            if workflow_id in ended:
                continue
            ended.add(workflow_id)
            with contextlib.suppress(Exception):
                await self.client.get_workflow_handle(workflow_id).terminate("test over")
            with contextlib.suppress(Exception):
                pending += await started_children(self.client, workflow_id)
        state = await self.ledger()
        if self.node in state.nodes:
            record = state.nodes[self.node]
            record.state = NodeState.LOST
            await self.fleet.upsert_node(record)


# A workflow task the time-skipping server refuses comes back only when it times out (10 s, the
# default workflow task timeout): the server keeps no change of a refused completion and leaves
# the task started. It refuses one that cancels an activity which finished meanwhile
# (ACTIVITY_UNKNOWN, FAILED_PRECONDITION), as when a node drops its liveness watch (its engines
# changed, or a new boot registered) just as the watch returns. Seen once in the forced
# continue-as-new pass: the node's refresh published 15 s late. Every wait allows for one.
REFUSED_TASK_RETRY_S = 10.0


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 15.0) -> None:
    """Wait until `check` holds, for `timeout` seconds plus one refused task's retry."""
    deadline = asyncio.get_running_loop().time() + timeout + REFUSED_TASK_RETRY_S
    while not await _answered(check):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {check.__doc__ or check}")
        await asyncio.sleep(0.05)


# One try of a check. The time-skipping server holds a query to a workflow between two runs of a
# continue-as-new until its own deadline; given up after this long and asked again, one held
# query cannot use up a whole wait.
CHECK_TRY_S = 5.0


async def _answered(check: Callable[[], Awaitable[bool]]) -> bool:
    """The check's answer; False while a query cannot be answered yet."""
    try:
        return await asyncio.wait_for(check(), CHECK_TRY_S)
    except (RPCError, TimeoutError):
        return False


async def ask(
    handle: WorkflowHandle[Any, Any], query: Any, *args: Any, timeout: float = 30.0
) -> Any:
    """A query's answer, asked again while it cannot be answered yet: the time-skipping server
    holds a query to a workflow between two runs of a continue-as-new until its own deadline.
    For queries a test makes directly; inside eventually() a check is retried anyway."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            return await asyncio.wait_for(handle.query(query, *args), CHECK_TRY_S)
        except (RPCError, TimeoutError):
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.05)


async def finished(
    client: Client, workflow_id: str, result_type: type | None = None, timeout: float = 90.0
) -> Any:
    """The result of the workflow's last run once it has closed, following continue-as-new.
    Polls and reads the closing event rather than relying on handle.result(): on the
    time-skipping test server that long poll now and then never returns for a run that closed
    just after a continue-as-new (seen with the knob forced), even when asked again."""
    latest = client.get_workflow_handle(workflow_id)

    async def closed() -> bool:
        return (await latest.describe()).status != WorkflowExecutionStatus.RUNNING

    # The time-skipping server skips ahead only while a client waits on a result: one waits in
    # the background, so timers pass at once; the poll above decides when the workflow closed.
    skipping = asyncio.ensure_future(latest.result())
    try:
        await eventually(closed, timeout)
    except AssertionError as err:
        raise AssertionError(f"{workflow_id} still running: {await _waiting_on(latest)}") from err
    finally:
        skipping.cancel()
        await asyncio.gather(skipping, return_exceptions=True)
    last = (await latest.fetch_history()).events[-1]
    if not last.HasField("workflow_execution_completed_event_attributes"):
        raise AssertionError(f"{workflow_id} did not complete: event type {last.event_type}")
    if result_type is None:
        return None
    payloads = last.workflow_execution_completed_event_attributes.result.payloads
    [value] = await client.data_converter.decode(payloads, [result_type])
    return value


async def _waiting_on(handle: WorkflowHandle[Any, Any]) -> str:
    """What a running workflow waits on: its pending activities and children, and its last
    events, for a test that timed out waiting for it to close."""
    described = (await handle.describe()).raw_description
    activities = [
        f"{a.activity_type.name} (attempt {a.attempt}, state {a.state})"
        for a in described.pending_activities
    ]
    children = [c.workflow_id for c in described.pending_children]
    events = (await handle.fetch_history()).events[-8:]
    last = [WorkflowEventType.Name(e.event_type) for e in events]
    try:  # every long-lived llmgw workflow answers "describe": what it holds, as it sees it
        view = str(await asyncio.wait_for(handle.query("describe"), 5))[:1500]
    except Exception as err:  # noqa: BLE001 - a diagnostic: say why there is none
        view = f"(no describe: {err!r})"
    return f"pending activities {activities}, children {children}, last events {last}; {view}"


async def runs_newest_first(client: Client, workflow_id: str) -> AsyncIterator[list[HistoryEvent]]:
    """The events of each of the workflow's runs, from the latest back through continue-as-new."""
    run_id: str | None = None
    while True:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        events = list(history.events)
        yield events
        run_id = events[0].workflow_execution_started_event_attributes.continued_execution_run_id
        if not run_id:
            return


async def started_children(client: Client, workflow_id: str) -> list[str]:
    """The IDs of every child workflow the workflow started, over all its runs."""
    children: list[str] = []
    async for events in runs_newest_first(client, workflow_id):
        for event in events:
            if event.HasField("start_child_workflow_execution_initiated_event_attributes"):
                attributes = event.start_child_workflow_execution_initiated_event_attributes
                children.append(attributes.workflow_id)
    return children


async def activities_scheduled(client: Client, workflow_id: str, name: str) -> int:
    """How many times the workflow scheduled activity `name`, over all its runs."""
    count = 0
    async for events in runs_newest_first(client, workflow_id):
        for event in events:
            if event.HasField("activity_task_scheduled_event_attributes"):
                count += event.activity_task_scheduled_event_attributes.activity_type.name == name
    return count


# How often, and how far apart, a signal refused between two runs is sent again.
SIGNAL_TRIES = 20
SIGNAL_RETRY_S = 0.1


async def signal_across_runs(handle: WorkflowHandle[Any, Any], signal: Any, arg: Any) -> None:
    """`handle.signal(signal, arg)`, sent again when the time-skipping server answers NOT_FOUND
    "Completed workflow": it does for a signal that lands while a workflow continues as new (seen
    in the forced continue-as-new pass), where a real server hands it to the next run."""
    for _ in range(SIGNAL_TRIES - 1):
        try:
            await handle.signal(signal, arg)
            return
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
        await asyncio.sleep(SIGNAL_RETRY_S)
    await handle.signal(signal, arg)


async def signals_handled(client: Client, workflow_id: str, name: str) -> tuple[int, int]:
    """How many `name` signals the workflow has received over all its runs, and how many of
    those it has handled: a workflow task started after each and has completed. What a test
    waits for before it asserts that a signal changed nothing."""
    received = handled = 0
    async for events in runs_newest_first(client, workflow_id):
        signals = [
            i
            for i, event in enumerate(events)
            if event.HasField("workflow_execution_signaled_event_attributes")
            and event.workflow_execution_signaled_event_attributes.signal_name == name
        ]
        completed = [
            i
            for i, event in enumerate(events)
            if event.HasField("workflow_task_completed_event_attributes")
        ]
        seen_up_to = -1  # where the last completed workflow task started
        if completed:
            seen_up_to = max(
                i
                for i, event in enumerate(events[: completed[-1]])
                if event.HasField("workflow_task_started_event_attributes")
            )
        received += len(signals)
        handled += sum(1 for i in signals if i < seen_up_to)
    return received, handled


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


async def record_history(handle: WorkflowHandle[Any, Any], name: str) -> None:
    """With LLMGW_RECORD_HISTORIES=<era>, store this workflow's history as
    histories/<era>/<name>.json for tests/unit/test_replay.py. Stored histories are
    append-only: the executions they stand for may still be running in someone's cluster, so a
    file is never rewritten, and a behaviour change gets a new era beside the old ones.

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
        # The other test knobs it ran under (a shorter check interval changes when timers and
        # activities come), set again for its replay.
        "test_knobs": {
            name: value
            for name, value in os.environ.items()
            if name.startswith("LLMGW_TEST_") and name != CONTINUE_AS_NEW_EVERY
        },
        **history.to_json_dict(),
    }
    path.write_text(json.dumps(document, indent=1) + "\n")
