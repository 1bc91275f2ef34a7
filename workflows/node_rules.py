"""The node workflow's pure decisions: whether a registration may claim the node, the view a
registration makes, which engines a plan still needs installed, and what a re-verification
changed.

Pure: the node workflow (workflows/node.py) runs them inside the sandbox, and replays them.
"""

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.contracts import (
        EnginePlan,
        EngineRequirement,
        EngineState,
        EngineStatus,
        NodeRecord,
        NodeRegistration,
        NodeState,
        NodeView,
        VerifyEnginesResult,
    )
    from workflows.names import reserved_node_name


class AgentSilent(Exception):
    """The node's agent went silent past its grace while this workflow waited on it."""


def check_registration(
    expected: str, reg: NodeRegistration, view: NodeView | None, live: bool
) -> None:
    """Raise ValueError unless `reg` may register as node `expected`. `live`: the node is ready
    and heard from within its grace."""
    # A node cannot claim another node's workflow: its inventory must carry this node's name,
    # the identity of the join token this node was given, and, while the node is live, the
    # same machine.
    reserved = reserved_node_name(expected)
    if reserved is not None:
        raise ValueError(reserved)
    if reg.inventory.name != expected:
        raise ValueError(f"node {reg.inventory.name!r} cannot register as {expected!r}")
    if view is None:
        return
    if view.identity and reg.identity != view.identity:
        raise ValueError(
            f"node {expected!r} was joined with another token; give this machine that "
            f"node's token, or `llmgw node rm {expected}` first"
        )
    record = view.record
    ours, theirs = record.inventory.machine_id, reg.inventory.machine_id
    if live and ours and theirs and ours != theirs:
        raise ValueError(
            f"node {expected!r} is live on another machine ({record.inventory.hostname}); "
            "two agents cannot share a node name"
        )


def view_of(view: NodeView | None, reg: NodeRegistration) -> NodeView:
    """The node as `reg` describes it, keeping what the operator decided (`view`: the node as
    it was, None for a new node)."""
    record = NodeRecord(inventory=reg.inventory, state=NodeState.READY, labels=reg.labels)
    identity = reg.identity
    operator_labels: dict[str, str] = {}
    if view is not None:
        old = view.record
        record.cordoned, record.draining, record.note = old.cordoned, old.draining, old.note
        record.engines = dict(old.engines)
        operator_labels = view.operator_labels
        record.labels = {**reg.labels, **operator_labels}  # an operator's labels win
        identity = view.identity or reg.identity
    return NodeView(
        record=record,
        boot_id=reg.boot_id,
        identity=identity,
        operator_labels=operator_labels,
        engine_paths=reg.engine_paths,
        lost_after_s=reg.lost_after_s,
        gone_after_s=reg.gone_after_s,
    )


def have_engine(record: NodeRecord, req: EngineRequirement) -> bool:
    """Installed at this version and path already: an agent restart does not reinstall.
    The install itself is idempotent too; this only saves the child workflow."""
    have = record.engines.get(req.engine)
    return (
        have is not None
        and have.state == EngineState.INSTALLED
        and have.version == req.version
        and (req.path is None or have.path == req.path)
    )


def apply_plan(record: NodeRecord, plan: EnginePlan) -> list[EngineRequirement]:
    """Bring the record's engines in line with `plan`: forget engines it no longer lists, mark
    those unavailable, and those still to install as installing. Returns those to install."""
    wanted = {req.engine for req in plan.install} | set(plan.unavailable)
    record.engines = {e: s for e, s in record.engines.items() if e in wanted}
    record.engines.update(plan.unavailable)
    todo = [req for req in plan.install if not have_engine(record, req)]
    for req in todo:
        record.engines[req.engine] = EngineStatus(
            engine=req.engine, version=req.version, state=EngineState.INSTALLING
        )
    return todo


def take_verified(engines: dict[str, EngineStatus], result: VerifyEnginesResult) -> bool:
    """Take a re-verification's statuses into `engines`; True when any changed."""
    changed = False
    for status in result.engines:
        before = engines.get(status.engine)
        if before is None or before.version != status.version:
            continue
        # verified_at too: `llmgw nodes` says when each engine was last seen to run.
        changed = changed or before != status
        engines[status.engine] = status
    return changed
