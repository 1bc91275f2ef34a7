"""A model's replica workflows as children: starting one (at a fresh index), telling one to
stop, starting one again under its own ID, making their count match the spec, and the bound on
how many one run may start.

Runs inside the model workflow (workflows/model/workflow.py), on its state; the order of what these
functions await is the order of the commands in its history.
"""

import asyncio
import contextlib
from typing import TYPE_CHECKING

from temporalio import workflow
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.contracts import ReplicaInput, StopReplica
    from workflows.dead_replicas import free_dead_replicas
    from workflows.names import replica_id, replica_workflow_id
    from workflows.replica.workflow import ReplicaWorkflow

if TYPE_CHECKING:
    from workflows.model.workflow import ModelWorkflow

# A run started replica workflows until its count was met: past 2,000 started in one run (each a
# pending child until it closes) Temporal refused the next start and the model failed its task
# for good. Now a run starts at most REPLICAS_STARTED_PER_RUN and the next run goes on.
BOUNDED_CHILDREN_PATCH = "model-starts-a-bounded-number-of-replicas-per-run"
# A model started its replicas one after another, each start waiting for Temporal to say it began
# before the next was asked: one workflow task's round trip each, about 3.5 minutes for 2,100 on a
# loaded 2-core machine. Now up to REPLICAS_STARTED_TOGETHER (20) are asked for at once.
STARTS_TOGETHER_PATCH = "model-starts-its-replicas-together"


def children_full(model: "ModelWorkflow") -> bool:
    """This run has started as many replicas as it may: the rest are started by the next
    run, after a continue-as-new (the count, and the replacements still to make, are in the
    carried state). Replicas a run started stay its pending children while they run, and
    Temporal refuses a run's 2,001st."""
    with workflow.unsafe.sandbox_unrestricted():  # a test knob read from the environment
        full = model.children_started >= options.replicas_started_per_run()
    return full and workflow.patched(BOUNDED_CHILDREN_PATCH)


def starts_allowed(model: "ModelWorkflow", missing: int) -> int:
    """How many of the missing replicas to start at once: at most REPLICAS_STARTED_TOGETHER,
    and no more than this run may still start."""
    with workflow.unsafe.sandbox_unrestricted():  # a test knob read from the environment
        room = options.replicas_started_per_run() - model.children_started
    return max(1, min(missing, room, options.REPLICAS_STARTED_TOGETHER))


async def start_replica(model: "ModelWorkflow") -> int:
    while True:
        index = model.state.next_index
        model.state.next_index += 1
        if await start_at(model, index):
            model.children_started += 1
            model.state.indices.append(index)
            return index


async def start_replicas(model: "ModelWorkflow", count: int) -> None:
    """Start `count` replicas at the next indices at once; an index that is taken is skipped
    (its replica is not counted: the caller's loop starts another). The indices join the state
    in their order once every start has answered, so the history does not depend on which
    answered first."""
    first = model.state.next_index
    model.state.next_index += count
    indices = range(first, first + count)
    started = await asyncio.gather(*(start_at(model, index) for index in indices))
    for index, ok in zip(indices, started, strict=True):
        if ok:
            model.children_started += 1
            model.state.indices.append(index)


async def start_at(model: "ModelWorkflow", index: int) -> bool:
    """Start the replica workflow of this index; False if its ID is taken."""
    spec = model.state.spec
    try:
        await workflow.start_child_workflow(
            ReplicaWorkflow.run,
            ReplicaInput(replica_id=replica_id(spec.name, index), model=spec),
            id=replica_workflow_id(spec.name, index),
            parent_close_policy=ParentClosePolicy.ABANDON,
        )
    except WorkflowAlreadyStartedError:
        # A replica of an earlier model of this name still runs under this ID (it was
        # removed and added again while that replica stopped): never share its ID, its
        # engine key or its allocation; take the next index.
        workflow.logger.info("%s: index %d is taken, skipping it", spec.name, index)
        return False
    return True


async def stop_replica(model: "ModelWorkflow", index: int, request: StopReplica) -> None:
    handle = workflow.get_external_workflow_handle(
        replica_workflow_id(model.state.spec.name, index)
    )
    try:
        await handle.signal(ReplicaWorkflow.stop, request)
    except ApplicationError as err:
        # The replica workflow is closed (an operator terminated it): nobody is left to
        # release what it held, so do it here rather than fail the model.
        workflow.logger.warning("%s: cannot tell it to stop (%s)", handle.id, err)
        await free_dead_replicas(model.state, [index])
        return
    model.state.stopping.append(index)


async def restart_replicas(model: "ModelWorkflow", indices: list[int]) -> None:
    """Start each replica again under its own ID: the new run finds the allocation its
    predecessor held and adopts the engine still serving on it (workflows/replica/workflow.py). Its
    route stays as it was meanwhile, and it keeps its place in the count."""
    spec = model.state.spec
    for index in indices:
        workflow_id = replica_workflow_id(spec.name, index)
        workflow.logger.warning("%s: its workflow closed unbidden; starting it again", workflow_id)
        with contextlib.suppress(WorkflowAlreadyStartedError):  # someone else already did
            await workflow.start_child_workflow(
                ReplicaWorkflow.run,
                ReplicaInput(replica_id=replica_id(spec.name, index), model=spec),
                id=workflow_id,
                parent_close_policy=ParentClosePolicy.ABANDON,
            )


async def reconcile_count(model: "ModelWorkflow") -> None:
    """Start or stop replicas until their count matches the spec."""
    spec = model.state.spec
    # An external model's replicas are its URLs: it runs none of its own (and stops any it
    # ran before its definition turned external).
    wanted = 0 if spec.external else spec.replicas
    while len(model.state.indices) < wanted and not children_full(model):
        if workflow.patched(STARTS_TOGETHER_PATCH):
            await start_replicas(model, starts_allowed(model, wanted - len(model.state.indices)))
        else:
            await start_replica(model)
    while len(model.state.indices) > wanted:
        index = model.state.indices.pop()  # newest first
        reason = "model removed" if model.state.removing else "scaled down"
        await stop_replica(model, index, StopReplica(reason=reason))
