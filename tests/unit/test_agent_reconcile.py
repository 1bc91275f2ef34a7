"""The agent stops an engine only on Temporal's definite word that no workflow owns it.

Seen: an outage of the Temporal server over a minute made every agent's periodic reconcile take
"could not describe the replica workflow" for "no workflow owns this engine", and stop every
engine on every node."""

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from activities.agent.engine_ownership import Ownership, ownership, reconcile_shards
from workflows.contracts import EngineExit


class FakeHandle:
    def __init__(self, workflow_id: str, answer: Any) -> None:
        self.id = workflow_id
        self.answer = answer
        self.signals: list[object] = []

    async def describe(self, rpc_timeout: Any = None) -> Any:
        if isinstance(self.answer, BaseException):
            raise self.answer
        # A replica started by hand, not as a model's child: its model is the one its ID names.
        return SimpleNamespace(status=self.answer, id=self.id, parent_id=None)

    async def signal(self, handler: object, arg: Any, rpc_timeout: Any = None) -> None:
        if isinstance(self.answer, BaseException):
            raise self.answer
        self.signals.append(handler)


class FakeClient:
    def __init__(self, answers: dict[str, Any]) -> None:
        self.handles = {wid: FakeHandle(wid, answer) for wid, answer in answers.items()}

    def get_workflow_handle(self, workflow_id: str) -> FakeHandle:
        # A workflow the test names no answer for has never existed.
        return self.handles.get(workflow_id) or FakeHandle(workflow_id, not_found())


@dataclass
class FakeSupervisor:
    alive: dict[str, str]  # replica id -> workflow id
    stopped: list[str] = field(default_factory=list)

    def shards(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(replica_id=r, workflow_id=w) for r, w in self.alive.items()]

    def is_alive(self, replica_id: str) -> bool:
        return replica_id not in self.stopped

    def stop(self, replica_id: str, grace_s: float = 0) -> None:
        self.stopped.append(replica_id)


@dataclass
class FakeAgent:
    supervisor: FakeSupervisor
    dead: list[SimpleNamespace] = field(default_factory=list)

    def dead_shards(self) -> list[SimpleNamespace]:
        return self.dead


def unavailable() -> RPCError:
    return RPCError("connection refused", RPCStatusCode.UNAVAILABLE, b"")


def not_found() -> RPCError:
    return RPCError("workflow not found", RPCStatusCode.NOT_FOUND, b"")


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (WorkflowExecutionStatus.RUNNING, Ownership.OWNED),
        # Terminated, and its model (model:m) never existed: nothing will start it again.
        (WorkflowExecutionStatus.TERMINATED, Ownership.ORPHAN),
        (WorkflowExecutionStatus.COMPLETED, Ownership.ORPHAN),
        (not_found(), Ownership.ORPHAN),
        (unavailable(), Ownership.UNKNOWN),
        (RPCError("deadline exceeded", RPCStatusCode.DEADLINE_EXCEEDED, b""), Ownership.UNKNOWN),
        (TimeoutError(), Ownership.UNKNOWN),
    ],
)
async def test_only_a_definite_answer_makes_an_engine_an_orphan(
    answer: WorkflowExecutionStatus | BaseException, expected: Ownership
) -> None:
    client = FakeClient({"replica:m:0": answer})
    assert await ownership(client, "replica:m:0") == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        (WorkflowExecutionStatus.RUNNING, Ownership.OWNED),  # it starts the replica again
        (WorkflowExecutionStatus.TERMINATED, Ownership.OWNED),  # applying it again adopts it
        (WorkflowExecutionStatus.COMPLETED, Ownership.ORPHAN),  # the model was removed
        (unavailable(), Ownership.UNKNOWN),
    ],
)
async def test_a_terminated_replicas_engine_is_kept_while_its_model_may_want_it(
    model: WorkflowExecutionStatus | BaseException, expected: Ownership
) -> None:
    client = FakeClient({"replica:m:0": WorkflowExecutionStatus.TERMINATED, "model:m": model})
    assert await ownership(client, "replica:m:0") == expected  # type: ignore[arg-type]


async def test_an_unreachable_temporal_stops_no_engine() -> None:
    supervisor = FakeSupervisor({"m-0": "replica:m:0", "m-1": "replica:m:1"})
    client = FakeClient({"replica:m:0": unavailable(), "replica:m:1": TimeoutError()})
    await reconcile_shards(client, FakeAgent(supervisor))  # type: ignore[arg-type]
    assert supervisor.stopped == []


async def test_an_engine_whose_workflow_closed_or_never_existed_is_stopped() -> None:
    supervisor = FakeSupervisor({"m-0": "replica:m:0", "m-1": "replica:m:1", "m-2": "replica:m:2"})
    client = FakeClient(
        {
            "replica:m:0": WorkflowExecutionStatus.RUNNING,
            "replica:m:1": WorkflowExecutionStatus.TERMINATED,
            "replica:m:2": not_found(),
        }
    )
    await reconcile_shards(client, FakeAgent(supervisor))  # type: ignore[arg-type]
    assert sorted(supervisor.stopped) == ["m-1", "m-2"]


async def test_a_dead_engine_is_forgotten_only_when_its_workflow_is_gone() -> None:
    """An engine that died unwatched is reported to its workflow; while Temporal cannot be
    reached its record is kept, so the report is made at the next look."""
    supervisor = FakeSupervisor({})
    dead = [
        SimpleNamespace(workflow_id="replica:m:0", exit=EngineExit(replica_id="m-0")),
        SimpleNamespace(workflow_id="replica:m:1", exit=EngineExit(replica_id="m-1")),
    ]
    client = FakeClient({"replica:m:0": unavailable(), "replica:m:1": not_found()})
    await reconcile_shards(client, FakeAgent(supervisor, dead))  # type: ignore[arg-type]
    assert supervisor.stopped == ["m-1"]
