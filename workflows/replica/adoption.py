"""A replica workflow started again under its ID takes over what its predecessor held.

An operator can terminate or cancel a replica's workflow (or reset it to its start); Temporal
then runs none of its code, so its allocation, route and engine are left as they were. Its model
starts it again under the same ID (workflows/model/workflow.py), or the reset does. The new run
first
asks the ledger for the allocation held under its replica id: if there is one, it does not place
again but runs on it, and the launch adopts the engine still running there (the agent keeps a
spec per shard: activities/agent/supervisor.py). Until the engine proves to be the one it wants
and ready, the route its predecessor published (ready, say) is left alone, so gateways keep
sending it requests: a restart of the workflow is invisible to clients.
"""

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.contracts import Allocation, AllocationLookup, ReplicaAllocation
    from workflows.names import ControlActivity


async def held_allocation(replica_id: str) -> Allocation | None:
    """What the ledger holds under `replica_id` (None: nothing, a new replica)."""
    held: ReplicaAllocation = await workflow.execute_activity(
        ControlActivity.LEDGER_ALLOCATION,
        AllocationLookup(replica_id=replica_id),
        start_to_close_timeout=options.LEDGER_CALL_TIMEOUT,
        retry_policy=options.LEDGER_RETRY,
        result_type=ReplicaAllocation,
    )
    return held.allocation
