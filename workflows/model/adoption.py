"""A model run that knows of no replica takes over those an earlier run left.

A model's workflow an operator terminated leaves its replica workflows running (they are
abandoned, not terminated, when their parent closes) and their engines serving. Applied again
(`llmgw model apply`, the admin API), the model starts a fresh run with no replica in its state:
it would start index 0 onwards, a second copy of every replica beside the first. Instead, before
anything else, the fresh run reads the routes the ledger holds for the model (every replica,
placed or not, publishes one until it stops) and counts their indices as its own: serving ones
in its replica count, stopping ones as stopping. Its next check of the replica workflows
(workflows/model/replica_checks.py `check_replicas`) then starts again, under their own IDs,
those whose workflow an operator closed too, and forgets those that stopped; the count is then
made right as for any model, the newest stopped first.
"""

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.contracts import ModelName, ModelState, ReplicaState, RoutingTable
    from workflows.names import ControlActivity


def index_in(model: str, rid: str) -> int | None:
    """The index in replica id `rid` (workflows/names.py replica_id) of `model`, or None."""
    rest = rid.removeprefix(f"{model}-")
    return int(rest) if rest != rid and rest.isdigit() else None


async def adopt_left_replicas(state: ModelState) -> bool:
    """Count the replicas the ledger lists for this model as this run's own; True when there
    were any. Runs once per model (ModelState.adopted); an external model's routes are its URLs,
    which it publishes itself."""
    state.adopted = True
    if state.indices or state.stopping or state.spec.external:
        return False
    name = state.spec.name
    table: RoutingTable = await workflow.execute_activity(
        ControlActivity.LEDGER_MODEL_ROUTES,
        ModelName(name=name),
        start_to_close_timeout=options.LEDGER_CALL_TIMEOUT,
        retry_policy=options.LEDGER_RETRY,
        result_type=RoutingTable,
    )
    found = False
    for route in sorted(table.routes, key=lambda r: r.replica_id):
        index = index_in(name, route.replica_id) if route.model == name else None
        if index is None:
            continue
        found = True
        state.next_index = max(state.next_index, index + 1)
        if route.state in (ReplicaState.STOPPING, ReplicaState.STOPPED):
            state.stopping.append(index)
            continue
        state.indices.append(index)
        if route.fingerprint and route.state == ReplicaState.READY:
            # What it serves, so a rolling update goes on where the earlier run left it.
            state.fingerprints[index] = route.fingerprint
    if found:
        workflow.logger.warning(
            "%s: took over replicas %s left by an earlier run", name, sorted(state.indices)
        )
    return found
