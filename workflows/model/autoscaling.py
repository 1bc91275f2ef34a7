"""The model's autoscaling: when it looks next, the look at its engines' load and the decision
it makes from it (workflows/autoscale.py), and telling the ledger whether a request should wake
a model scaled to zero.

Runs inside the model workflow (workflows/model/workflow.py), on its state; the order of what these
functions await is the order of the commands in its history.
"""

from datetime import timedelta
from typing import TYPE_CHECKING

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.autoscale import decide
    from workflows.contracts import EngineLoad, LoadTotals, ModelState
    from workflows.model.calls import engine_load_totals, engine_loads, set_idle

if TYPE_CHECKING:
    from workflows.model.workflow import ModelWorkflow

# Retired (docs/workflow-versions.md): the old branch is gone; deprecate_patch() still replays
# the histories that carry its marker.
AUTOSCALE_YIELDS_TO_CHANGES_PATCH = "model-autoscale-yields-to-changes-made-while-it-looked"
# A look at the engines' load ran one activity per hosting node, one after another: about
# 8,500 nodes filled a history in one look, and the whole routing table of the model (every
# replica's route) came back through history first. Now one control activity reads every
# node's agent metrics and answers with sums (workflows/model/calls.py engine_load_totals).
LOAD_IN_ONE_LOOK_PATCH = "model-looks-at-its-load-in-one-bounded-activity"


def next_look(state: ModelState) -> timedelta | None:
    policy = state.spec.autoscale
    if policy is None or state.removing or state.spec.external:
        return None
    return timedelta(seconds=policy.look_every_s)


async def autoscale(model: "ModelWorkflow") -> None:
    spec = model.state.spec
    if spec.autoscale is None or spec.external:
        return
    replicas = spec.replicas
    loads: list[EngineLoad] | LoadTotals | None
    if workflow.patched(LOAD_IN_ONE_LOOK_PATCH):
        loads = await engine_load_totals(spec.name)
    else:
        loads = await engine_loads(spec.name)
    changed = model.state.removing or model.state.spec is not spec or spec.replicas != replicas
    if changed:
        # A removal or a scale made while it looked wins; it looks again next time.
        workflow.deprecate_patch(AUTOSCALE_YIELDS_TO_CHANGES_PATCH)
        return
    if loads is None:
        return  # the look failed: a blind look changes nothing
    decision = decide(
        spec.autoscale,
        replicas,
        spec.min_replicas,
        spec.max_replicas,
        model.state.autoscale,
        loads,
        workflow.now(),
    )
    model.state.autoscale = decision.state
    if decision.replicas != spec.replicas:
        workflow.logger.info(
            "%s: %d -> %d replicas (%s)", spec.name, spec.replicas, decision.replicas,
            decision.reason,
        )  # fmt: skip
        spec.replicas = decision.replicas
        model.dirty = True


async def publish_idle(state: ModelState) -> None:
    """Tell the ledger (and so every gateway) whether a request should wake this model."""
    spec = state.spec
    idle = spec.autoscale is not None and spec.replicas == 0 and not state.removing
    if idle == state.published_idle:
        return
    await set_idle(spec.name, idle)
    state.published_idle = idle
