"""A model: its declared spec and how many replicas it should have.

Replicas are child workflows with deterministic IDs (replica:<model>:<index>); they are
abandoned rather than terminated if this workflow closes, and told to stop with a signal, so a
replica always gets to stop its engine and release what it holds.

Moving a replica (its node drains, is lost or removed) starts a successor first. A drained
replica keeps serving until its successor says it is ready; one on a lost node stops at once.
A rolling update is the same move, one replica at a time: when a replica reports a profile
fingerprint the catalog no longer has, a successor starts from the current definition and the
old one stops once the successor serves. Except when only the LoRA adapters of a profile whose
engine loads them at runtime (vLLM) changed: the replica is told the new definition
(`update_adapters`) and loads and unloads them in its running engine; only if it cannot is it
replaced.

An external model (engine "external": servers llmgw does not run) has no replica workflows and
places nothing: this workflow publishes one ready route per URL to the ledger itself, replaces
them when the URLs change and withdraws them when the model is removed.

The whole state, pending work included, is one ModelState carried through continue-as-new.
Replicas are reached by workflow ID, never by a child handle (none survives a continue-as-new):
once a minute the model asks Temporal which of its replica workflows still run (a control
activity, cheap and bounded). One that closed without being told to stop (an operator
terminated or cancelled it, or it failed) left its engine, allocation and route behind: the
model starts it again under its ID, and the new run adopts all three (workflows/replica.py). One
told to stop that closed before it had (terminated mid-stop) is stopped here: the model
withdraws the route, asks the node's agent to stop the engine, and frees the allocation once the
engine is stopped, or its node is gone, asking again at each check until then. A
removal polls the same way until every stopping replica has closed, so it waits for them across
any number of continue-as-new. Polling was chosen over replicas signalling their release: it
also covers a replica that never gets to signal (terminated, failed), and needs no change to the
replica workflow.
"""

import asyncio
import contextlib
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, WorkflowAlreadyStartedError
from temporalio.workflow import ChildWorkflowHandle, ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from workflows import history_budget, options
    from workflows.autoscale import decide
    from workflows.cancel_refusal import refusing_cancel
    from workflows.catalog import CatalogError, endpoint_base, validate_model
    from workflows.contracts import (
        EngineLoad,
        LoadTotals,
        ModelSpec,
        ModelState,
        ModelView,
        ModelWake,
        RemoveModel,
        ReplaceReplicas,
        ReplicaInput,
        ReplicaReady,
        ReplicaState,
        ReplicaView,
        ScaleRequest,
        StopReplica,
        UpdateAdapters,
        WorkflowStatuses,
    )
    from workflows.dead_replicas import free_dead_replicas, retry_unstopped
    from workflows.ledger_activity import call_ledger
    from workflows.messages import MODEL_REPLICA_READY
    from workflows.model_adoption import adopt_left_replicas
    from workflows.model_calls import (
        engine_load_totals,
        engine_loads,
        set_idle,
        workflow_statuses,
        workflow_statuses_batched,
    )
    from workflows.model_rules import (
        adapters_to_tell,
        check_removal,
        check_scale,
        model_view,
        stale_indices,
        watched_indices,
    )
    from workflows.model_rules import external_route as external_route  # re-exported
    from workflows.names import (
        ControlActivity,
        external_replica_id,
        replica_id,
        replica_workflow_id,
    )
    from workflows.replica import ReplicaWorkflow

# Runs that started before this kept pending work in memory and waited on child handles; their
# histories replay on the unpatched loop below (_run_before_carried_state).
CARRIED_STATE_PATCH = "model-carries-state-watches-replicas-by-id"
# A removal that arrived while a pass was already past stopping replicas (during one of its
# activities) used to end the model with a replica still running: now the loop goes round once
# more to stop it. Runs from before keep their ending.
REMOVAL_STOPS_LATE_REPLICAS_PATCH = "model-removal-stops-replicas-of-a-late-remove"
# The autoscaler used to decide from the replica count read before it asked for the engines'
# load, and so undid a removal or a scale that arrived while it asked: a removed model kept a
# replica and never closed. Now a change made meanwhile wins, and it looks again next time.
AUTOSCALE_YIELDS_TO_CHANGES_PATCH = "model-autoscale-yields-to-changes-made-while-it-looked"
# A changed LoRA adapter list rolled every replica. Now a replica whose engine loads adapters at
# runtime (vLLM) and whose profile changed only in its adapters is told the new definition
# (the replica's `update_adapters` signal) and keeps serving; runs from before keep rolling.
ADAPTERS_AT_RUNTIME_PATCH = "model-tells-replicas-new-adapters-instead-of-rolling"
# A removal that arrived while a pass was publishing an external model's routes ended the model
# with those routes still in the ledger: gateways kept sending a removed model's requests to its
# URLs. Now the model closes only once every route it published is withdrawn.
REMOVAL_WITHDRAWS_EXTERNAL_ROUTES_PATCH = "model-removal-waits-for-external-routes-withdrawn"
# A run started replica workflows until its count was met: past 2,000 started in one run (each a
# pending child until it closes) Temporal refused the next start and the model failed its task
# for good. Now a run starts at most REPLICAS_STARTED_PER_RUN and the next run goes on.
BOUNDED_CHILDREN_PATCH = "model-starts-a-bounded-number-of-replicas-per-run"
# A replica workflow that closed without being told to stop (an operator terminated or cancelled
# it, or it failed) was cleaned up and replaced: its healthy engine stopped and a second copy
# loaded. Now it is started again under its own ID and adopts its allocation and engine
# (workflows/replica.py); one told to stop that closed before it could is cleaned up as before.
RESTART_UNBIDDEN_PATCH = "model-restarts-a-replica-that-closed-unbidden"
# A model applied again after its workflow was terminated started its replicas from index 0 (a
# second copy of each). Now a run that knows of no replica first takes over those the ledger
# lists for it (workflows/model_adoption.py).
ADOPT_LEFT_REPLICAS_PATCH = "model-adopts-replicas-an-earlier-run-left"
# A cancel request ended the model as cancelled, its replicas orphaned. Now it is refused
# (workflows/cancel_refusal.py).
REFUSES_CANCEL_PATCH = "model-refuses-cancel"
# A look at the engines' load ran one activity per hosting node, one after another: about
# 8,500 nodes filled a history in one look, and the whole routing table of the model (every
# replica's route) came back through history first. Now one control activity reads every
# node's agent metrics and answers with sums (workflows/model_calls.py engine_load_totals).
LOAD_IN_ONE_LOOK_PATCH = "model-looks-at-its-load-in-one-bounded-activity"
# The check sent every replica's workflow ID to one activity, described one after another:
# 5,000 replicas did not finish in its 30 s. Now batches of options.REPLICA_CHECK_BATCH go
# out at once, each described concurrently.
CHECK_IN_BATCHES_PATCH = "model-checks-its-replicas-in-bounded-batches"


@workflow.defn(name="Model")
class ModelWorkflow:
    @workflow.init
    def __init__(self, state: ModelState) -> None:
        self.state = state
        # Only the unpatched loop awaits these (a replica's close, for a removal).
        self.children: dict[int, ChildWorkflowHandle[ReplicaWorkflow, ReplicaView]] = {}
        self.stopping_children: list[ChildWorkflowHandle[ReplicaWorkflow, ReplicaView]] = []
        self.dirty = True
        # When the autoscaler looks next, and when the replica workflows are checked next.
        self.look_at: datetime | None = state.look_at
        self.check_at: datetime | None = state.check_at
        # Replica workflows this run started: each stays a pending child of the run until it
        # closes, and a run may have at most 2,000.
        self.children_started = 0

    @workflow.run
    async def run(self, state: ModelState) -> ModelView:  # noqa: ARG002 - @workflow.init took it
        if not workflow.patched(CARRIED_STATE_PATCH):
            return await self._run_before_carried_state()
        if self.check_at is None:
            self.check_at = workflow.now() + options.REPLICA_CHECK_EVERY
        if workflow.patched(REFUSES_CANCEL_PATCH):
            return await refusing_cancel(self._live(), "remove a model with `llmgw model rm`")
        return await self._live()

    async def _live(self) -> ModelView:
        adopting = not self.state.adopted and workflow.patched(ADOPT_LEFT_REPLICAS_PATCH)
        if adopting and await adopt_left_replicas(self.state):
            self.check_at = workflow.now()  # restart or forget the closed ones at once
        while True:
            wait = self._until_next_wake()
            if wait is None or wait > timedelta(0):
                # A timeout only wakes the loop: what is due is decided from the clock below.
                with contextlib.suppress(TimeoutError):
                    await workflow.wait_condition(lambda: self.dirty, timeout=wait)
            await self._due_checks()
            await self._act()
            if self._removed():
                # Every replica told to stop has closed and every engine is stopped: what they
                # held is released, so the name can be reused.
                return self._view()
            if history_budget.time_to_continue() or self._children_full():
                await workflow.wait_condition(workflow.all_handlers_finished)
                self.state.look_at, self.state.check_at = self.look_at, self.check_at
                workflow.continue_as_new(self.state)

    def _removed(self) -> bool:
        state = self.state
        if not state.removing or state.stopping or state.unstopped:
            return False
        if workflow.patched(REMOVAL_WITHDRAWS_EXTERNAL_ROUTES_PATCH) and state.external_routes:
            return False  # the loop's next pass withdraws them (the removal left it dirty)
        # Replicas not yet told to stop: the removal came after this pass had stopped replicas.
        return not state.indices or not workflow.patched(REMOVAL_STOPS_LATE_REPLICAS_PATCH)

    async def _act(self) -> None:
        """One pass over what the model must do: the same steps, in the same order, in both
        loops (histories depend on the order)."""
        self.dirty = False
        await self._replace()
        await self._retire_replaced()
        await self._reconcile()
        await self._tell_adapters()
        await self._roll()
        await self._publish_idle()
        await self._publish_external()

    async def _run_before_carried_state(self) -> ModelView:
        """The loop as it was before CARRIED_STATE_PATCH, for runs (and histories) from then."""
        while True:
            try:
                await workflow.wait_condition(lambda: self.dirty, timeout=self._next_look())
            except TimeoutError:
                await self._autoscale()
            await self._act()
            if self.state.removing:
                # Wait for the replicas to release what they hold, so the name can be reused.
                for handle in self.stopping_children:
                    await handle
                return self._view()
            if workflow.info().is_continue_as_new_suggested():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(self.state)

    def _until_next_wake(self) -> timedelta | None:
        """How long the loop may sleep: until the autoscaler's next look, the next check of the
        replica workflows (only while there are some), or the next poll of a removal waiting
        for its stopping replicas. None: until something happens."""
        now = workflow.now()
        wakes: list[datetime] = []
        if self._next_look() is not None:
            if self.look_at is None:
                self.look_at = now + (self._next_look() or timedelta(0))
            wakes.append(self.look_at)
        if (self._watched() or self.state.unstopped) and self.check_at is not None:
            wakes.append(self.check_at)
        if self.state.removing and (self.state.stopping or self.state.unstopped):
            wakes.append(now + options.STOPPING_POLL)
        if not wakes:
            return None
        return max(min(wakes) - now, timedelta(0))

    async def _due_checks(self) -> None:
        now = workflow.now()
        if self.look_at is not None and now >= self.look_at:
            self.look_at = None
            await self._autoscale()
        removal_waits = self.state.removing and bool(self.state.stopping)
        if removal_waits or (self.check_at is not None and now >= self.check_at):
            self.check_at = now + options.REPLICA_CHECK_EVERY
            await retry_unstopped(self.state)
            await self._check_replicas()

    @workflow.update(name="apply")
    def apply(self, spec: ModelSpec) -> ModelView:
        self.state.spec = spec
        self.dirty = True
        return self._view()

    @apply.validator
    def _check_apply(self, spec: ModelSpec) -> None:
        self._check_not_removing()
        if spec.name != self.state.spec.name:
            raise ApplicationError(f"this is model {self.state.spec.name!r}, not {spec.name!r}")
        try:
            validate_model(spec)
        except CatalogError as err:
            raise ApplicationError(str(err), type="InvalidModel") from None

    @workflow.update(name="scale")
    def scale(self, req: ScaleRequest) -> ModelView:
        self.state.spec.replicas = req.replicas
        self.dirty = True
        return self._view()

    @scale.validator
    def _check_scale(self, req: ScaleRequest) -> None:
        self._check_not_removing()
        check_scale(self.state.spec, req.replicas)

    @workflow.update(name="remove")
    def remove(self, req: RemoveModel) -> ModelView:  # noqa: ARG002 - the update's payload
        self.state.removing = True
        self.state.spec.replicas = 0
        self.dirty = True
        return self._view()

    @remove.validator
    def _check_remove(self, req: RemoveModel) -> None:
        check_removal(req)

    @workflow.signal(name="replace")
    def replace(self, req: ReplaceReplicas) -> None:
        """Signalled by node workflows (drain, lost, removed): a fact about where replicas run."""
        self.state.replacements.append(req)
        self.dirty = True

    @workflow.signal(name="wake")
    def wake(self, req: ModelWake) -> None:  # noqa: ARG002 - the signal's payload
        """A gateway holds a request for this model at zero replicas (a fact, so a signal: the
        gateway does not wait on the workflow, it waits for a ready route)."""
        spec = self.state.spec
        if spec.replicas == 0 and spec.autoscale is not None and not self.state.removing:
            spec.replicas = max(1, spec.min_replicas)
            self.state.autoscale.last_active = workflow.now()
            self.dirty = True

    @workflow.signal(name=MODEL_REPLICA_READY)
    def replica_ready(self, ready: ReplicaReady) -> None:
        name = self.state.spec.name
        index = self._index_of(ready.replica_id)
        if index is not None and ready.fingerprint:
            self.state.fingerprints[index] = ready.fingerprint
            self.state.restart_fingerprints[index] = ready.restart_fingerprint
            self.dirty = True
        if any(replica_id(name, s) == ready.replica_id for s in self.state.retiring.values()):
            if ready.replica_id not in self.state.ready_replicas:
                self.state.ready_replicas.append(ready.replica_id)
            self.dirty = True

    @workflow.query(name="describe")
    def describe(self) -> ModelView:
        return self._view()

    def _check_not_removing(self) -> None:
        if self.state.removing:
            raise ApplicationError(f"model {self.state.spec.name!r} is being removed")

    def _view(self) -> ModelView:
        return model_view(self.state)

    def _next_look(self) -> timedelta | None:
        policy = self.state.spec.autoscale
        if policy is None or self.state.removing or self.state.spec.external:
            return None
        return timedelta(seconds=policy.look_every_s)

    async def _autoscale(self) -> None:
        spec = self.state.spec
        if spec.autoscale is None or spec.external:
            return
        replicas = spec.replicas
        loads: list[EngineLoad] | LoadTotals | None
        if workflow.patched(LOAD_IN_ONE_LOOK_PATCH):
            loads = await engine_load_totals(spec.name)
        else:
            loads = await engine_loads(spec.name)
        changed = self.state.removing or self.state.spec is not spec or spec.replicas != replicas
        if changed and workflow.patched(AUTOSCALE_YIELDS_TO_CHANGES_PATCH):
            return
        if loads is None:
            return  # the look failed: a blind look changes nothing
        decision = decide(
            spec.autoscale,
            replicas,
            spec.min_replicas,
            spec.max_replicas,
            self.state.autoscale,
            loads,
            workflow.now(),
        )
        self.state.autoscale = decision.state
        if decision.replicas != spec.replicas:
            workflow.logger.info(
                "%s: %d -> %d replicas (%s)", spec.name, spec.replicas, decision.replicas,
                decision.reason,
            )  # fmt: skip
            spec.replicas = decision.replicas
            self.dirty = True

    async def _publish_idle(self) -> None:
        """Tell the ledger (and so every gateway) whether a request should wake this model."""
        spec = self.state.spec
        idle = spec.autoscale is not None and spec.replicas == 0 and not self.state.removing
        if idle == self.state.published_idle:
            return
        await set_idle(spec.name, idle)
        self.state.published_idle = idle

    def _children_full(self) -> bool:
        """This run has started as many replicas as it may: the rest are started by the next
        run, after a continue-as-new (the count, and the replacements still to make, are in the
        carried state). Replicas a run started stay its pending children while they run, and
        Temporal refuses a run's 2,001st."""
        with workflow.unsafe.sandbox_unrestricted():  # a test knob read from the environment
            full = self.children_started >= options.replicas_started_per_run()
        return full and workflow.patched(BOUNDED_CHILDREN_PATCH)

    def _index_of(self, rid: str) -> int | None:
        name = self.state.spec.name
        return next((i for i in self.state.indices if replica_id(name, i) == rid), None)

    def _stale(self) -> list[int]:
        return stale_indices(self.state)

    async def _tell_adapters(self) -> None:
        """Tell each replica that takes adapter changes at runtime, once per definition, to
        serve this one's adapters (it answers with replica_ready, or is replaced if it cannot:
        model_rules.adapter_updates)."""
        if self.state.removing or self.state.spec.external:
            return
        told = adapters_to_tell(self.state)
        if not told or not workflow.patched(ADAPTERS_AT_RUNTIME_PATCH):
            return
        self.state.adapters_at_runtime = True
        spec = self.state.spec
        version = spec.adapters_version()
        for index in told:
            self.state.adapters_told[index] = version
            handle = workflow.get_external_workflow_handle(replica_workflow_id(spec.name, index))
            try:
                await handle.signal(ReplicaWorkflow.update_adapters, UpdateAdapters(model=spec))
            except ApplicationError as err:
                # Its workflow is closed: the next check of the replicas finds it dead.
                workflow.logger.warning("%s: cannot tell it new adapters (%s)", handle.id, err)

    async def _roll(self) -> None:
        """One stale replica at a time: wait until the last move is over before the next."""
        if self.state.retiring or self.state.removing or self.state.spec.external:
            return
        stale = self._stale()
        if stale:
            name = self.state.spec.name
            req = ReplaceReplicas(replica_ids=[replica_id(name, stale[0])], reason="rolling update")
            self.state.replacements.append(req)
            await self._replace()

    async def _start_replica(self) -> int:
        spec = self.state.spec
        while True:
            index = self.state.next_index
            self.state.next_index += 1
            try:
                handle = await workflow.start_child_workflow(
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
                continue
            self.children[index] = handle
            self.children_started += 1
            self.state.indices.append(index)
            return index

    async def _stop_replica(self, index: int, request: StopReplica) -> None:
        handle = workflow.get_external_workflow_handle(
            replica_workflow_id(self.state.spec.name, index)
        )
        try:
            await handle.signal(ReplicaWorkflow.stop, request)
        except ApplicationError as err:
            # The replica workflow is closed (an operator terminated it): nobody is left to
            # release what it held, so do it here rather than fail the model.
            workflow.logger.warning("%s: cannot tell it to stop (%s)", handle.id, err)
            await free_dead_replicas(self.state, [index])
            return
        self.state.stopping.append(index)
        if index in self.children:
            self.stopping_children.append(self.children.pop(index))

    def _watched(self) -> list[int]:
        return watched_indices(self.state)

    async def _check_replicas(self) -> None:
        """Ask Temporal which of this model's replica workflows still run. A stopping one that
        closed has released what it held; one that closed without being told to stop is dead."""
        watched = self._watched()
        if not watched:
            return
        name = self.state.spec.name
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
        closed = [
            i for i in watched if not statuses.running.get(replica_workflow_id(name, i), True)
        ]
        self.state.stopping = [i for i in self.state.stopping if i not in closed]
        dead = [i for i in closed if i in self.state.indices or i in self.state.retiring]
        if workflow.patched(RESTART_UNBIDDEN_PATCH):
            unbidden = [i for i in closed if statuses.ended_unbidden(replica_workflow_id(name, i))]
            await self._restart_replicas([i for i in unbidden if i in dead])
            # Told to stop, it ended before it had: stop its engine and free what it held here.
            await free_dead_replicas(self.state, [i for i in unbidden if i not in dead])
            dead = [i for i in dead if i not in unbidden]
        if dead:
            await free_dead_replicas(self.state, dead)
            self._forget(dead)

    async def _restart_replicas(self, indices: list[int]) -> None:
        """Start each replica again under its own ID: the new run finds the allocation its
        predecessor held and adopts the engine still serving on it (workflows/replica.py). Its
        route stays as it was meanwhile, and it keeps its place in the count."""
        spec = self.state.spec
        for index in indices:
            workflow_id = replica_workflow_id(spec.name, index)
            workflow.logger.warning(
                "%s: its workflow closed unbidden; starting it again", workflow_id
            )
            with contextlib.suppress(WorkflowAlreadyStartedError):  # someone else already did
                await workflow.start_child_workflow(
                    ReplicaWorkflow.run,
                    ReplicaInput(replica_id=replica_id(spec.name, index), model=spec),
                    id=workflow_id,
                    parent_close_policy=ParentClosePolicy.ABANDON,
                )

    def _forget(self, dead: list[int]) -> None:
        """Drop dead replicas from the state; _reconcile starts replacements for the count, and
        a retiring replica whose successor died gets a new successor (it keeps serving)."""
        for index in dead:
            self.state.retiring.pop(index, None)
            if index in self.state.indices:
                self.state.indices.remove(index)
            self._forget_fingerprints(index)
            for old, successor in list(self.state.retiring.items()):
                if successor == index and not self.state.removing:
                    del self.state.retiring[old]
                    self.state.replacements.append(
                        ReplaceReplicas(
                            replica_ids=[replica_id(self.state.spec.name, old)],
                            reason="its successor's workflow closed",
                        )
                    )
                    # Back in the count until its new successor serves.
                    self.state.indices.append(old)
        self.dirty = True

    async def _replace(self) -> None:
        """Start a successor for each replica asked to move; the old one stops now or later."""
        name = self.state.spec.name
        while self.state.replacements and not self._children_full():
            req = self.state.replacements.pop(0)
            for rid in req.replica_ids:
                old = self._index_of(rid)
                if old is None:
                    # Already moved, or retiring: a lost node overrides a drain's patience.
                    retiring = [i for i in self.state.retiring if replica_id(name, i) == rid]
                    for index in retiring if not req.wait_for_successor else []:
                        del self.state.retiring[index]
                        await self._stop_replica(index, self._moved(req))
                    continue
                self.state.indices.remove(old)
                self._forget_fingerprints(old)
                successor = await self._start_replica()
                if req.wait_for_successor and not self.state.removing:
                    self.state.retiring[old] = successor
                else:
                    await self._stop_replica(old, self._moved(req))

    def _forget_fingerprints(self, index: int) -> None:
        for known in (
            self.state.fingerprints,
            self.state.restart_fingerprints,
            self.state.adapters_told,
        ):
            known.pop(index, None)

    @staticmethod
    def _moved(req: ReplaceReplicas) -> StopReplica:
        return StopReplica(reason=req.reason, engine_gone=not req.wait_for_successor)

    async def _retire_replaced(self) -> None:
        """Stop each replaced replica whose successor serves, or is itself gone."""
        name = self.state.spec.name
        for old, successor in list(self.state.retiring.items()):
            successor_id = replica_id(name, successor)
            gone = successor not in self.state.indices
            if successor_id in self.state.ready_replicas or gone or self.state.removing:
                del self.state.retiring[old]
                if successor_id in self.state.ready_replicas:
                    self.state.ready_replicas.remove(successor_id)
                reason = f"moved to {successor_id}" if not gone else "replaced"
                await self._stop_replica(old, StopReplica(reason=reason))

    async def _reconcile(self) -> None:
        """Start or stop replicas until their count matches the spec."""
        spec = self.state.spec
        # An external model's replicas are its URLs: it runs none of its own (and stops any it
        # ran before its definition turned external).
        wanted = 0 if spec.external else spec.replicas
        while len(self.state.indices) < wanted and not self._children_full():
            await self._start_replica()
        while len(self.state.indices) > wanted:
            index = self.state.indices.pop()  # newest first
            reason = "model removed" if self.state.removing else "scaled down"
            await self._stop_replica(index, StopReplica(reason=reason))

    async def _publish_external(self) -> None:
        """One ready route per URL of an external model, through the ledger update replicas
        use; a URL no longer listed (or every URL, once removed or no longer external) has its
        route withdrawn. A URL keeps its replica id while it stays listed, and every route is
        published again on each pass, so a changed definition reaches its fingerprint."""
        spec = self.state.spec
        published = self.state.external_routes
        wanted: list[str] = []
        if spec.external and not self.state.removing:
            wanted = [endpoint_base(url) for url in spec.profiles[0].urls]
        if not wanted and not published:
            return
        ids = {endpoint: rid for rid, endpoint in published.items()}
        routes: dict[str, str] = {}
        for endpoint in wanted:
            rid = ids.get(endpoint)
            if rid is None:
                rid = external_replica_id(spec.name, self.state.next_index)
                self.state.next_index += 1
            routes[rid] = endpoint
        fingerprint = spec.profile_fingerprint(0) if spec.external else ""
        # Add before withdrawing, so a gateway never sees the model with no route mid-change.
        await asyncio.gather(
            *(
                self._set_route(rid, endpoint, ReplicaState.READY, fingerprint)
                for rid, endpoint in routes.items()
            )
        )
        self.state.external_routes = routes
        await asyncio.gather(
            *(
                self._set_route(rid, endpoint, ReplicaState.STOPPED, fingerprint)
                for rid, endpoint in published.items()
                if rid not in routes
            )
        )

    async def _set_route(
        self, rid: str, endpoint: str, state: ReplicaState, fingerprint: str
    ) -> None:
        route = external_route(self.state.spec, rid, endpoint, state)
        route.fingerprint = fingerprint
        await call_ledger(ControlActivity.LEDGER_SET_ROUTE, route)
