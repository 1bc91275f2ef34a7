"""Moving a model's replicas: a successor started for each replica asked to move (its node
drains, is lost or removed), the old one stopped at once or once its successor serves; a rolling
update, the same move one stale replica at a time; and, instead of a roll, new LoRA adapters told
to replicas whose engine loads them at runtime.

Runs inside the model workflow (workflows/model/workflow.py), on its state; the order of what these
functions await is the order of the commands in its history.
"""

from typing import TYPE_CHECKING

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from workflows.contracts import ModelState, ReplaceReplicas, StopReplica, UpdateAdapters
    from workflows.model.children import children_full, start_replica, stop_replica
    from workflows.model.rules import adapters_to_tell, index_of, stale_indices
    from workflows.names import replica_id, replica_workflow_id
    from workflows.replica.workflow import ReplicaWorkflow

if TYPE_CHECKING:
    from workflows.model.workflow import ModelWorkflow

# A changed LoRA adapter list rolled every replica. Now a replica whose engine loads adapters at
# runtime (vLLM) and whose profile changed only in its adapters is told the new definition
# (the replica's `update_adapters` signal) and keeps serving; runs from before keep rolling.
ADAPTERS_AT_RUNTIME_PATCH = "model-tells-replicas-new-adapters-instead-of-rolling"


async def make_replacements(model: "ModelWorkflow") -> None:
    """Start a successor for each replica asked to move; the old one stops now or later."""
    name = model.state.spec.name
    while model.state.replacements and not children_full(model):
        req = model.state.replacements.pop(0)
        for rid in req.replica_ids:
            old = index_of(model.state, rid)
            if old is None:
                # Already moved, or retiring: a lost node overrides a drain's patience.
                retiring = [i for i in model.state.retiring if replica_id(name, i) == rid]
                for index in retiring if not req.wait_for_successor else []:
                    del model.state.retiring[index]
                    await stop_replica(model, index, moved(req))
                continue
            model.state.indices.remove(old)
            forget_fingerprints(model.state, old)
            successor = await start_replica(model)
            if req.wait_for_successor and not model.state.removing:
                model.state.retiring[old] = successor
            else:
                await stop_replica(model, old, moved(req))


def forget_fingerprints(state: ModelState, index: int) -> None:
    for known in (
        state.fingerprints,
        state.restart_fingerprints,
        state.adapters_told,
    ):
        known.pop(index, None)


def moved(req: ReplaceReplicas) -> StopReplica:
    return StopReplica(reason=req.reason, engine_gone=not req.wait_for_successor)


async def retire_replaced(model: "ModelWorkflow") -> None:
    """Stop each replaced replica whose successor serves, or is itself gone."""
    name = model.state.spec.name
    for old, successor in list(model.state.retiring.items()):
        successor_id = replica_id(name, successor)
        gone = successor not in model.state.indices
        if successor_id in model.state.ready_replicas or gone or model.state.removing:
            del model.state.retiring[old]
            if successor_id in model.state.ready_replicas:
                model.state.ready_replicas.remove(successor_id)
            reason = f"moved to {successor_id}" if not gone else "replaced"
            await stop_replica(model, old, StopReplica(reason=reason))


async def tell_adapters(model: "ModelWorkflow") -> None:
    """Tell each replica that takes adapter changes at runtime, once per definition, to
    serve this one's adapters (it answers with replica_ready, or is replaced if it cannot:
    model_rules.adapter_updates)."""
    if model.state.removing or model.state.spec.external:
        return
    told = adapters_to_tell(model.state)
    if not told or not workflow.patched(ADAPTERS_AT_RUNTIME_PATCH):
        return
    model.state.adapters_at_runtime = True
    spec = model.state.spec
    version = spec.adapters_version()
    for index in told:
        model.state.adapters_told[index] = version
        handle = workflow.get_external_workflow_handle(replica_workflow_id(spec.name, index))
        try:
            await handle.signal(ReplicaWorkflow.update_adapters, UpdateAdapters(model=spec))
        except ApplicationError as err:
            # Its workflow is closed: the next check of the replicas finds it dead.
            workflow.logger.warning("%s: cannot tell it new adapters (%s)", handle.id, err)


async def roll_stale(model: "ModelWorkflow") -> None:
    """One stale replica at a time: wait until the last move is over before the next."""
    if model.state.retiring or model.state.removing or model.state.spec.external:
        return
    stale = stale_indices(model.state)
    if stale:
        name = model.state.spec.name
        req = ReplaceReplicas(replica_ids=[replica_id(name, stale[0])], reason="rolling update")
        model.state.replacements.append(req)
        await make_replacements(model)
