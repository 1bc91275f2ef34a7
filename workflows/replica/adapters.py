"""The replica workflow's steps when its model's adapters change while its engine serves
(workflows/replica/workflow.py mixes them in): for engines that load adapters at runtime, the new
adapters are fetched to its nodes, loaded by the node's agent and the route republished; a
replica that cannot tells its model, which replaces it."""

from collections.abc import Callable, Sequence

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from workflows.contracts import (
        Allocation,
        ModelSpec,
        ReplicaState,
        SetAdaptersRequest,
        ShardAllocation,
    )
    from workflows.replica.calls import fetch_artifacts, set_adapters
    from workflows.replica.parts import ReplicaParts
    from workflows.replica.rules import new_adapter_artifacts, takes_adapters_at_runtime

PATCH_ADAPTERS_AT_RUNTIME = "replica-loads-new-adapters-into-its-running-engine"


class ReplicaAdapterSteps(ReplicaParts):
    """Mixed into ReplicaWorkflow (what it calls of the others: parts.py)."""

    def _launch_with_next_model(self, alloc: Allocation) -> None:
        """A definition its model sent while the engine was not serving: the launch about to
        happen takes its adapters, when nothing else of the profile changed."""
        new = self.s.next_model
        if new is None or not takes_adapters_at_runtime(self.inp.model, new, alloc.profile_index):
            return  # any other change: told once it serves (_update_adapters), and replaced
        if workflow.patched(PATCH_ADAPTERS_AT_RUNTIME):
            self.inp.model = new
            self.s.next_model = None

    async def _update_adapters(self, alloc: Allocation, ended: Callable[[], bool]) -> None:
        """Serve the definition its model sent: fetch its new adapters' artifacts, have the
        engine load and unload adapters, and publish the route with the new list. A replica
        that cannot (another change came with it, the fetch failed, the engine refused) keeps
        serving what it has and tells its model, which replaces it. A stop, or the engine's
        end (`ended`), interrupts it: the caller's loop then takes that in hand."""
        new = self.s.next_model
        self.s.next_model = None
        if new is None or not workflow.patched(PATCH_ADAPTERS_AT_RUNTIME):
            return
        index = alloc.profile_index
        shards = alloc.shards_or_leader()
        why_not = "its profile changed in more than its adapters"
        if takes_adapters_at_runtime(self.inp.model, new, index):

            def interrupted() -> bool:
                return bool(self.s.stop or self.s.exit_report) or ended()

            loaded = await self._load_adapters(new, index, shards, interrupted)
            if loaded is None:
                self.s.next_model = self.s.next_model or new  # taken at the next launch
                return
            why_not = loaded
        if why_not:
            workflow.logger.warning("%s: %s: to be replaced", self.inp.replica_id, why_not)
            await self._set_state(ReplicaState.READY, f"{why_not}: to be replaced")
            await self._tell_model_ready(adapters_at_runtime=False)
            return
        self.inp.model = new
        await self._set_state(ReplicaState.READY)
        await self._tell_model_ready()

    async def _load_adapters(
        self,
        new: ModelSpec,
        index: int,
        shards: Sequence[ShardAllocation],
        interrupted: Callable[[], bool],
    ) -> str | None:
        """Fetch and load `new`'s adapters in the running engine: "" once it serves them, else
        why not; None when `interrupted` first."""
        wanted = new.profiles[index].lora
        if wanted == self.inp.model.profiles[index].lora:
            return ""
        artifacts = new_adapter_artifacts(self.inp.model, new, index)
        if artifacts:
            nodes = list(dict.fromkeys(shard.node for shard in shards))
            why_not = await fetch_artifacts(artifacts, nodes, interrupted)
            if interrupted():
                return None
            if why_not is not None:
                return f"adapters not loaded: {why_not}"
        request = SetAdaptersRequest(
            replica_id=self.inp.replica_id, model=new.name, adapters=wanted
        )
        try:
            loaded = await set_adapters(request, shards[0], interrupted)
        except ActivityError as err:
            return f"adapters not loaded: {err.cause}"
        if loaded is None:
            return None
        if self.s.kv is not None:
            self.s.kv = self.s.kv.model_copy(update={"adapters": loaded.adapters})
        return ""
