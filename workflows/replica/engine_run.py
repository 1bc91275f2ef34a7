"""One run of the replica's engine (workflows/replica/workflow.py mixes these steps in): fetch its
artifacts, start (or adopt) every shard, the leader first, wait for the leader to serve, route to
it, and supervise every shard until one exits, a stop is asked for, or an agent reports the
engine gone; a new adapter list from its model is loaded meanwhile.
"""

from collections.abc import Callable, Sequence
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError
from temporalio.workflow import ActivityHandle

with workflow.unsafe.imports_passed_through():
    from workflows.contracts import (
        Allocation,
        EngineExit,
        LaunchResult,
        ReplicaState,
        ShardAllocation,
    )
    from workflows.replica.calls import (
        await_shared_fetches,
        cancel_all,
        fetch_artifacts,
        start_launch,
        start_supervise,
        start_wait_ready,
    )
    from workflows.replica.fetch_wait import FetchWaits, wait_for_fetches
    from workflows.replica.parts import ReplicaParts
    from workflows.replica.rules import artifacts_to_fetch, taken_ports

# Retired (docs/workflow-versions.md): their old branches are gone; deprecate_patch() still
# replays the histories that carry their markers.
PATCH_START_RACES_STOP = "replica-start-races-stop"
PATCH_SKIP_TAKEN_PORTS = "replica-skips-ports-taken-by-others"
# Replicas from before fetched a model's artifacts in a control activity of their own; now
# through the node's ArtifactFetch workflow, shared with its other replicas.
PATCH_SHARED_FETCH = "replica-fetches-through-artifact-fetch-workflow"
# Replicas from before waited for a shared fetch inside a control activity, holding one of the
# control worker's slots for as long as the download took; now they wait in the workflow.
PATCH_FETCH_WAIT_IN_WORKFLOW = "replica-waits-for-fetches-in-its-workflow"


class ReplicaEngineRun(ReplicaParts):
    """Mixed into ReplicaWorkflow (what it calls of the others: parts.py)."""

    fetch_waits: FetchWaits

    async def _run_engine_once(self, alloc: Allocation) -> EngineExit:
        """Start (or adopt) the engine's shards, wait for the leader to serve, route to it, and
        supervise every shard until one exits or a stop is asked for.

        A multi-node replica starts its leader first (the workers connect to it), and its
        workers are judged by staying alive while the leader loads: the rendezvous wait is the
        leader's readiness timeout. One shard ending ends the replica; all restart together."""
        shards = alloc.shards_or_leader()
        leader = shards[0]
        self.s.exit_report = None
        self._launch_with_next_model(alloc)
        artifacts = artifacts_to_fetch(self.inp.model, alloc.profile_index)
        # Taking over a predecessor's engine: its route stays as it was until that engine is
        # known to be the one wanted (adopted) and ready.
        quiet, self.s.adopt = self.s.adopt, False
        await self._set_state(
            ReplicaState.STARTING, "fetching the weights" if artifacts else "", publish=not quiet
        )
        if artifacts:
            nodes = list(dict.fromkeys(shard.node for shard in shards))

            def stopped() -> bool:
                return self.s.stop is not None

            model = self.inp.model.name
            if workflow.patched(PATCH_FETCH_WAIT_IN_WORKFLOW):
                # One ArtifactFetch workflow per node and artifact, shared with the node's other
                # replicas, shown in `llmgw fetches` and the Temporal UI; it signals the end.
                why_not = await wait_for_fetches(self.fetch_waits, model, artifacts, nodes, stopped)
            elif workflow.patched(PATCH_SHARED_FETCH):
                why_not = await await_shared_fetches(model, artifacts, nodes, stopped)
            else:
                why_not = await fetch_artifacts(artifacts, nodes, stopped)
            if why_not is not None:
                return self._exit(why_not)
        pids = []
        adopted = True
        for shard in shards:
            launch = await self._launch(alloc, shard)
            if launch is None:
                return self._exit("stop requested")
            if isinstance(launch, ActivityError):
                if len(shards) > 1:
                    await self._stop_engine(alloc)
                if taken_ports(launch) is not None:
                    workflow.deprecate_patch(PATCH_SKIP_TAKEN_PORTS)
                    return await self._leave_taken_ports(launch)
                where = f" on {shard.node}" if len(shards) > 1 else ""
                return self._exit(f"start failed{where}: {launch.cause}")
            pids.append(f"{shard.node}:{launch.pid}" if len(shards) > 1 else f"{launch.pid}")
            adopted = adopted and launch.adopted
            if shard is leader:
                self.s.kv = launch.kv
        await self._set_state(
            ReplicaState.LOADING, f"pid {', '.join(pids)}", publish=not (quiet and adopted)
        )

        workers = [start_supervise(self.inp.replica_id, shard) for shard in shards[1:]]
        ready_handle = start_wait_ready(self.inp.replica_id, leader)
        first = await self._first([ready_handle, *workers])
        if isinstance(first, EngineExit):
            return first
        if first is not ready_handle:  # a worker ended while the leader loaded
            return await self._end_all(alloc, [ready_handle, *workers], first)
        try:
            ready = ready_handle.result()
        except ActivityError as err:
            # The agent stayed away through every attempt: a fault to restart from, like an exit.
            return await self._end_all(alloc, workers, None, f"readiness: {err.cause}")
        if not ready.ready:
            await cancel_all(workers)
            await self._stop_engine(alloc)
            return self._exit(f"never ready: {ready.detail}")
        await self._set_state(ReplicaState.READY)
        await self._tell_model_ready()
        watched = [start_supervise(self.inp.replica_id, leader), *workers]
        while True:
            ended = await self._first(watched, lambda: self.s.next_model is not None)
            if ended is None:
                await self._update_adapters(alloc, lambda: any(h.done() for h in watched))
                continue
            if isinstance(ended, EngineExit):
                return ended
            return await self._end_all(alloc, watched, ended)

    async def _launch(
        self, alloc: Allocation, shard: ShardAllocation
    ) -> LaunchResult | ActivityError | None:
        """Start (or adopt) one shard's engine: its launch result, the launch's failure, or None
        when a stop was asked for first (a stop never waits for a node that does not answer)."""
        handle = start_launch(self.inp.replica_id, self.inp.model, alloc, shard)
        await workflow.wait_condition(lambda: handle.done() or self.s.stop is not None)
        if not handle.done():
            workflow.deprecate_patch(PATCH_START_RACES_STOP)
            await cancel_all([handle])
            return None
        try:
            launched: LaunchResult = await handle
        except ActivityError as err:
            return err
        return launched

    async def _first(
        self, handles: Sequence[ActivityHandle[Any]], wake: Callable[[], bool] = lambda: False
    ) -> ActivityHandle[Any] | EngineExit | None:
        """The first activity to finish, unless a stop is asked for or an agent reports the
        engine gone first: then every activity is cancelled and the interruption returned.
        None when `wake` turned true first (the activities run on)."""
        await workflow.wait_condition(
            lambda: (
                any(h.done() for h in handles) or bool(self.s.stop or self.s.exit_report) or wake()
            )
        )
        done = next((h for h in handles if h.done()), None)
        if done is not None:
            return done
        if not (self.s.stop or self.s.exit_report):
            return None
        await cancel_all(handles)
        if self.s.exit_report is not None:
            return self.s.exit_report
        return self._exit("stop requested")

    async def _end_all(
        self,
        alloc: Allocation,
        handles: Sequence[ActivityHandle[Any]],
        ended: ActivityHandle[Any] | None,
        reason: str = "",
    ) -> EngineExit:
        """One shard ended: the others cannot serve without it. Stop them before a restart, so
        the restart starts every shard afresh instead of adopting half a replica."""
        exit_info = self._exit(reason)
        if ended is not None:
            try:
                exit_info = ended.result()
            except ActivityError as err:
                exit_info = self._exit(f"supervision: {err.cause}")
        await cancel_all([h for h in handles if h is not ended])
        if len(alloc.shards_or_leader()) > 1:
            await self._stop_engine(alloc)
        return exit_info
