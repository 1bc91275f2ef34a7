"""The model's check of its replica workflows: which still run (asked of Temporal, in bounded
batches); a stopping one that closed has released what it held, one that closed unbidden is
started again under its own ID, and one told to stop that closed before it had is stopped here.
A replica found dead is forgotten, and a retiring replica whose successor died gets another.

Runs inside the model workflow (workflows/model/workflow.py), on its state; the order of what these
functions await is the order of the commands in its history.
"""

from typing import TYPE_CHECKING

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from workflows.contracts import ReplaceReplicas, WorkflowStatuses
    from workflows.dead_replicas import free_dead_replicas
    from workflows.model.calls import workflow_statuses, workflow_statuses_batched
    from workflows.model.children import restart_replicas
    from workflows.model.moves import forget_fingerprints
    from workflows.model.rules import watched_indices
    from workflows.names import replica_id, replica_workflow_id

if TYPE_CHECKING:
    from workflows.model.workflow import ModelWorkflow

# A replica workflow that closed without being told to stop (an operator terminated or cancelled
# it, or it failed) was cleaned up and replaced: its healthy engine stopped and a second copy
# loaded. Now it is started again under its own ID and adopts its allocation and engine
# (workflows/replica/workflow.py); one told to stop that closed before it could is cleaned up as
# before.
RESTART_UNBIDDEN_PATCH = "model-restarts-a-replica-that-closed-unbidden"
# The check sent every replica's workflow ID to one activity, described one after another:
# 5,000 replicas did not finish in its 30 s. Now batches of options.REPLICA_CHECK_BATCH go
# out at once, each described concurrently.
CHECK_IN_BATCHES_PATCH = "model-checks-its-replicas-in-bounded-batches"


async def check_replicas(model: "ModelWorkflow") -> None:
    """Ask Temporal which of this model's replica workflows still run. A stopping one that
    closed has released what it held; one that closed without being told to stop is dead."""
    watched = watched_indices(model.state)
    if not watched:
        return
    name = model.state.spec.name
    ids = [replica_workflow_id(name, i) for i in watched]
    batched = workflow.patched(CHECK_IN_BATCHES_PATCH)
    try:
        statuses: WorkflowStatuses = await (
            workflow_statuses_batched(ids) if batched else workflow_statuses(ids)
        )
    except ActivityError as err:
        # No answer proves nothing: look again next time.
        workflow.logger.warning("%s: could not check its replicas: %s", name, err.cause)
        return
    closed = [i for i in watched if not statuses.running.get(replica_workflow_id(name, i), True)]
    model.state.stopping = [i for i in model.state.stopping if i not in closed]
    dead = [i for i in closed if i in model.state.indices or i in model.state.retiring]
    if workflow.patched(RESTART_UNBIDDEN_PATCH):
        unbidden = [i for i in closed if statuses.ended_unbidden(replica_workflow_id(name, i))]
        await restart_replicas(model, [i for i in unbidden if i in dead])
        # Told to stop, it ended before it had: stop its engine and free what it held here.
        await free_dead_replicas(model.state, [i for i in unbidden if i not in dead])
        dead = [i for i in dead if i not in unbidden]
    if dead:
        await free_dead_replicas(model.state, dead)
        forget(model, dead)


def forget(model: "ModelWorkflow", dead: list[int]) -> None:
    """Drop dead replicas from the state; reconcile_count (workflows/model/children.py)
    starts replacements for the count, and a retiring replica whose successor died gets a new
    successor (it keeps serving)."""
    for index in dead:
        model.state.retiring.pop(index, None)
        if index in model.state.indices:
            model.state.indices.remove(index)
        forget_fingerprints(model.state, index)
        for old, successor in list(model.state.retiring.items()):
            if successor == index and not model.state.removing:
                del model.state.retiring[old]
                model.state.replacements.append(
                    ReplaceReplicas(
                        replica_ids=[replica_id(model.state.spec.name, old)],
                        reason="its successor's workflow closed",
                    )
                )
                # Back in the count until its new successor serves.
                model.state.indices.append(old)
    model.dirty = True
