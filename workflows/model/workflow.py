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
model starts it again under its ID, and the new run adopts all three
(workflows/replica/workflow.py). One
told to stop that closed before it had (terminated mid-stop) is stopped here: the model
withdraws the route, asks the node's agent to stop the engine, and frees the allocation once the
engine is stopped, or its node is gone, asking again at each check until then. A
removal polls the same way until every stopping replica has closed, so it waits for them across
any number of continue-as-new. Polling was chosen over replicas signalling their release: it
also covers a replica that never gets to signal (terminated, failed), and needs no change to the
replica workflow.
"""

import contextlib
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from workflows import history_budget, options
    from workflows.cancel_refusal import refusing_cancel
    from workflows.catalog import CatalogError, validate_model
    from workflows.contracts import (
        ModelSpec,
        ModelState,
        ModelView,
        ModelWake,
        RemoveModel,
        ReplaceReplicas,
        ReplicaReady,
        ScaleRequest,
    )
    from workflows.dead_replicas import retry_unstopped
    from workflows.messages import MODEL_REPLICA_READY
    from workflows.model.adoption import adopt_left_replicas
    from workflows.model.autoscaling import autoscale, next_look, publish_idle
    from workflows.model.children import children_full, reconcile_count
    from workflows.model.external import publish_external
    from workflows.model.moves import make_replacements, retire_replaced, roll_stale, tell_adapters
    from workflows.model.replica_checks import check_replicas
    from workflows.model.rules import (
        check_removal,
        check_scale,
        index_of,
        model_view,
        watched_indices,
    )
    from workflows.names import replica_id

# Retired (docs/workflow-versions.md): their old branches are gone; deprecate_patch() still
# replays the histories that carry their markers.
CARRIED_STATE_PATCH = "model-carries-state-watches-replicas-by-id"
REMOVAL_STOPS_LATE_REPLICAS_PATCH = "model-removal-stops-replicas-of-a-late-remove"
# A removal that arrived while a pass was publishing an external model's routes ended the model
# with those routes still in the ledger: gateways kept sending a removed model's requests to its
# URLs. Now the model closes only once every route it published is withdrawn.
REMOVAL_WITHDRAWS_EXTERNAL_ROUTES_PATCH = "model-removal-waits-for-external-routes-withdrawn"
# A model applied again after its workflow was terminated started its replicas from index 0 (a
# second copy of each). Now a run that knows of no replica first takes over those the ledger
# lists for it (workflows/model/adoption.py).
ADOPT_LEFT_REPLICAS_PATCH = "model-adopts-replicas-an-earlier-run-left"
# A cancel request ended the model as cancelled, its replicas orphaned. Now it is refused
# (workflows/cancel_refusal.py).
REFUSES_CANCEL_PATCH = "model-refuses-cancel"


@workflow.defn(name="Model")
class ModelWorkflow:
    @workflow.init
    def __init__(self, state: ModelState) -> None:
        self.state = state
        self.dirty = True
        # When the autoscaler looks next, and when the replica workflows are checked next.
        self.look_at: datetime | None = state.look_at
        self.check_at: datetime | None = state.check_at
        # Replica workflows this run started: each stays a pending child of the run until it
        # closes, and a run may have at most 2,000.
        self.children_started = 0

    @workflow.run
    async def run(self, state: ModelState) -> ModelView:  # noqa: ARG002 - @workflow.init took it
        workflow.deprecate_patch(CARRIED_STATE_PATCH)
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
            if history_budget.time_to_continue() or children_full(self):
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
        if not state.indices:
            return True
        workflow.deprecate_patch(REMOVAL_STOPS_LATE_REPLICAS_PATCH)
        return False

    async def _act(self) -> None:
        """One pass over what the model must do, its steps in this order (histories depend on
        the order)."""
        self.dirty = False
        await make_replacements(self)
        await retire_replaced(self)
        await reconcile_count(self)
        await tell_adapters(self)
        await roll_stale(self)
        await publish_idle(self.state)
        await publish_external(self.state)

    def _until_next_wake(self) -> timedelta | None:
        """How long the loop may sleep: until the autoscaler's next look, the next check of the
        replica workflows (only while there are some), or the next poll of a removal waiting
        for its stopping replicas. None: until something happens."""
        now = workflow.now()
        wakes: list[datetime] = []
        if next_look(self.state) is not None:
            if self.look_at is None:
                self.look_at = now + (next_look(self.state) or timedelta(0))
            wakes.append(self.look_at)
        if (watched_indices(self.state) or self.state.unstopped) and self.check_at is not None:
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
            await autoscale(self)
        removal_waits = self.state.removing and bool(self.state.stopping)
        if removal_waits or (self.check_at is not None and now >= self.check_at):
            self.check_at = now + options.REPLICA_CHECK_EVERY
            await retry_unstopped(self.state)
            await check_replicas(self)

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
        index = index_of(self.state, ready.replica_id)
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
