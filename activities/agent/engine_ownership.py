"""The agent's adoption and orphan policy: which engines it keeps (their workflow runs, or will
come back to adopt them) and which it stops because nothing will own them again, and whether its
node was removed or its workflow only closed. Also what it tells replica workflows about engines
that died unwatched or that it stopped on its way out. The agent process (workers/agent.py) asks
this at start, before it registers, at each look at its engines, and when it stops.

Only a deliberate end removes anything. A workflow an operator terminated, cancelled or reset,
or one that failed, says nothing about what should run: its engines keep serving and what owns
them comes back (docs/operations.md, "Terminate, cancel and reset").

- A replica's engine is an orphan, and stopped, when its replica workflow completed (it stopped
  for good, and its stop did not reach this agent), or never existed; or when that workflow
  ended otherwise and its model's workflow completed (the model was removed) or never existed.
  While the replica's workflow runs, or its model's does (the model starts the replica again,
  which adopts the engine), or the model's ended otherwise (applying the model again adopts
  it), the engine is kept.
- A node is removed when its workflow completed with the node in state `removed` (`llmgw node
  rm`); any other end is a workflow to bring back, by registering again.
- No answer, of any kind, is neither: nothing is stopped on the strength of silence (DESIGN.md,
  "Faults and time").
"""

import asyncio
import logging
from datetime import timedelta
from enum import Enum

from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHandle,
)
from temporalio.service import RPCError, RPCStatusCode

from activities.agent.node_agent import NodeAgentActivities
from workflows.contracts import EngineExit, NodeState, NodeView, ReplicaView
from workflows.names import model_workflow_id
from workflows.replica.workflow import ReplicaWorkflow

log = logging.getLogger("llmgw.agent")
# One call to Temporal from the agent's own loop: long enough for a busy server, short enough
# that a frozen one does not stall the loop.
DESCRIBE_TIMEOUT = timedelta(seconds=10)


class Ownership(Enum):
    OWNED = "owned"  # its replica workflow runs, or comes back to adopt it
    ORPHAN = "orphan"  # nothing will ever own it again: a definite answer
    UNKNOWN = "unknown"  # Temporal could not be asked: silence proves nothing


class NodeEnd(Enum):
    RUNNING = "running"  # the node's workflow runs (or Temporal could not say otherwise)
    REMOVED = "removed"  # `llmgw node rm`: stop the engines and exit
    CLOSED = "closed"  # terminated, cancelled, failed: register again, keep serving


class _NoAnswer(Exception):
    """Temporal did not answer."""


async def _status(client: Client, workflow_id: str) -> WorkflowExecutionDescription | None:
    """The latest run's description; None when there is no such workflow. Raises _NoAnswer
    for anything else."""
    try:
        return await client.get_workflow_handle(workflow_id).describe(rpc_timeout=DESCRIBE_TIMEOUT)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise _NoAnswer(str(err)) from None
    except Exception as err:  # noqa: BLE001 - a timeout, a broken connection: no answer either
        raise _NoAnswer(str(err)) from None


def model_of(replica: WorkflowExecutionDescription | None, workflow_id: str) -> str:
    """The model workflow that started a replica: its parent, else the one its ID names
    (replica:<model>:<index>)."""
    if replica is not None and replica.parent_id:
        return replica.parent_id
    return model_workflow_id(workflow_id.removeprefix("replica:").rpartition(":")[0])


async def ownership(client: Client, workflow_id: str) -> Ownership:
    """Whether the engine of the replica workflow `workflow_id` is still wanted (module doc)."""
    try:
        replica = await _status(client, workflow_id)
        if replica is None or replica.status == WorkflowExecutionStatus.COMPLETED:
            return Ownership.ORPHAN
        if replica.status == WorkflowExecutionStatus.RUNNING:
            return Ownership.OWNED
        model = await _status(client, model_of(replica, workflow_id))
    except _NoAnswer as err:
        log.warning("could not ask about %s: %s", workflow_id, err)
        return Ownership.UNKNOWN
    if model is None or model.status == WorkflowExecutionStatus.COMPLETED:
        return Ownership.ORPHAN
    log.info(
        "%s ended (%s) while model %s still wants it: keeping its engine",
        workflow_id,
        replica.status.name.lower() if replica.status else "?",
        model.id,
    )
    return Ownership.OWNED


async def node_end(client: Client, workflow_id: str) -> NodeEnd:
    """How the node's workflow stands (module doc). Not found, or no answer, is RUNNING: the
    agent goes on watching and its engines keep serving."""
    try:
        described = await _status(client, workflow_id)
    except _NoAnswer:
        return NodeEnd.RUNNING
    if described is None or described.status == WorkflowExecutionStatus.RUNNING:
        return NodeEnd.RUNNING
    if described.status != WorkflowExecutionStatus.COMPLETED:
        return NodeEnd.CLOSED
    try:
        handle = client.get_workflow_handle(
            workflow_id, run_id=described.run_id, result_type=NodeView
        )
        view = await handle.result(follow_runs=False, rpc_timeout=DESCRIBE_TIMEOUT)
    except Exception as err:  # noqa: BLE001 - no answer: ask again at the next look
        log.warning("could not read how %s ended: %s", workflow_id, err)
        return NodeEnd.RUNNING
    removed = isinstance(view, NodeView) and view.record.state == NodeState.REMOVED
    return NodeEnd.REMOVED if removed else NodeEnd.CLOSED


def replica_handle(
    client: Client, workflow_id: str
) -> WorkflowHandle[ReplicaWorkflow, ReplicaView]:
    """The replica workflow that owns an engine (the engine's spec names its workflow ID)."""
    handle: WorkflowHandle[ReplicaWorkflow, ReplicaView] = client.get_workflow_handle(workflow_id)
    return handle


async def reconcile_shards(client: Client, agent: NodeAgentActivities) -> None:
    """Tell replica workflows about engines that died unwatched; stop engines nothing will own
    again (ownership above: they hold a port and cores). An engine whose owner cannot be
    asked right now is left alone until it can, and so is one whose replica workflow an
    operator closed while its model still wants it: the model starts the replica again, which
    adopts it."""
    for dead in agent.dead_shards():
        try:
            await replica_handle(client, dead.workflow_id).signal(
                ReplicaWorkflow.engine_exited, dead.exit
            )
            log.info("told %s its engine had ended", dead.workflow_id)
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                log.warning("could not tell %s its engine ended: %s", dead.workflow_id, err)
                continue  # told at the next look
            log.info("no workflow %s for a dead engine; forgetting it", dead.workflow_id)
            await asyncio.to_thread(agent.supervisor.stop, dead.exit.replica_id, 0)
    for spec in agent.supervisor.shards():
        if not agent.supervisor.is_alive(spec.replica_id):
            continue
        if await ownership(client, spec.workflow_id) == Ownership.ORPHAN:
            log.warning("stopping engine %s: no running workflow owns it", spec.replica_id)
            await asyncio.to_thread(agent.supervisor.stop, spec.replica_id, 10.0)


async def stop_engines_and_tell(client: Client, agent: NodeAgentActivities) -> None:
    """Stop every engine and tell each replica workflow, so that its route stops reading ready
    and it starts the engine again when this node's agent is back. Signals are recorded by the
    server even while no control worker runs."""
    owners = {spec.replica_id: spec.workflow_id for spec in agent.supervisor.shards()}
    stopped = await asyncio.to_thread(agent.stop_all_engines)
    for result in stopped:
        workflow_id = owners.get(result.replica_id)
        if not result.was_running or workflow_id is None:
            continue
        report = EngineExit(replica_id=result.replica_id, reason="stopped with its agent")
        try:
            await replica_handle(client, workflow_id).signal(ReplicaWorkflow.engine_exited, report)
        except RPCError as err:
            log.warning("could not tell %s its engine stopped: %s", workflow_id, err)
    log.info("stopped %d engine(s)", len(stopped))
