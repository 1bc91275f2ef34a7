"""The node workflow's pure decisions: whether a registration may claim the node, the view a
registration makes, which engines a plan still needs installed, and what a re-verification
changed.

Pure: the node workflow (workflows/node/workflow.py) runs them inside the sandbox, and replays them.
"""

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.contracts import (
        EnginePlan,
        EngineRequirement,
        EngineState,
        EngineStatus,
        NodeAdd,
        NodeRecord,
        NodeRegistration,
        NodeState,
        NodeView,
        VerifyEnginesResult,
    )
    from workflows.engine_plan import installable_engines
    from workflows.names import reserved_node_name
    from workflows.node.proof import (
        CLOCK_SKEW_MS,
        is_key_identity,
        signature_problem,
        signed_text,
    )


class AgentSilent(Exception):
    """The node's agent went silent past its grace while this workflow waited on it."""


def check_registration(
    expected: str, reg: NodeRegistration, view: NodeView | None, live: bool, now_ms: int
) -> None:
    """Raise ValueError unless `reg` may register as node `expected`. `live`: the node is ready
    and heard from within its grace; `now_ms`: the workflow's clock."""
    # A node cannot claim another node's workflow: its inventory must carry this node's name,
    # the identity of the join token this node was given, and, while the node is live, the
    # same machine.
    reserved = reserved_node_name(expected)
    if reserved is not None:
        raise ValueError(reserved)
    if reg.inventory.name != expected:
        raise ValueError(f"node {reg.inventory.name!r} cannot register as {expected!r}")
    if is_key_identity(reg.identity):
        check_proof(expected, reg, view, now_ms)
    if view is None:
        return
    # A node pinned to a key takes signed registrations only. One pinned before keys existed
    # (sha256 of its secret) still takes that, from an agent not yet upgraded, and is pinned to
    # the key of the first signed registration (workflows/node/rules.py view_of).
    upgrade = not is_key_identity(view.identity) and is_key_identity(reg.identity)
    if is_key_identity(view.identity) and not is_key_identity(reg.identity):
        raise ValueError(
            f"node {expected!r} takes signed registrations only, and this agent sent none: "
            "upgrade llmgw on that machine"
        )
    if view.identity and reg.identity != view.identity and not upgrade:
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


def check_proof(expected: str, reg: NodeRegistration, view: NodeView | None, now_ms: int) -> None:
    """A signed registration's signature, its freshness, and that it was not taken before."""
    text = signed_text(expected, reg.boot_id, reg.inventory.machine_id, reg.signed_at_ms)
    problem = signature_problem(reg.identity, text, reg.proof)
    if problem is not None:
        raise ValueError(f"node {expected!r}: registration refused: {problem}")
    if view is not None and reg.signed_at_ms <= view.last_signed_at_ms:
        raise ValueError(
            f"node {expected!r}: registration refused: it is a copy of one already taken (signed "
            "no later than the last); an agent signs each registration anew"
        )
    skew_s = (reg.signed_at_ms - now_ms) / 1000
    if abs(skew_s) * 1000 > CLOCK_SKEW_MS:
        raise ValueError(
            f"node {expected!r}: registration refused: signed {abs(skew_s):.0f} s "
            f"{'ahead of' if skew_s > 0 else 'behind'} the control plane's clock (at most "
            f"{CLOCK_SKEW_MS // 1000} s): set the node's clock right (NTP)"
        )


def check_add(expected: str, req: NodeAdd, view: NodeView | None) -> None:
    """Raise ValueError unless `req` may be recorded as an operator's expectation of node
    `expected`: an update refused here is never written to the node's history."""
    if req.name != expected:
        raise ValueError(f"this is node {expected!r}; `add` names {req.name!r}")
    if view is not None and view.record.state == NodeState.REMOVED:
        raise ValueError(f"node {expected!r} is being removed; add it again once it is gone")
    empty = sorted(key for key in req.labels if not key.strip())
    if empty:
        raise ValueError("a label needs a name: `add` carries a label with an empty key")
    both = sorted(set(req.disable_engines) & set(req.enable_engines))
    if both:
        raise ValueError(f"`add` both disables and enables {', '.join(both)}")
    unknown = sorted(set(req.disable_engines + req.enable_engines) - set(installable_engines()))
    if unknown:
        known = ", ".join(installable_engines())
        raise ValueError(f"no engine named {', '.join(unknown)} to disable or enable ({known})")


def disabled_after(view: NodeView, req: NodeAdd) -> list[str]:
    """The node's disabled engines once `req` is taken: an add without either list keeps them
    (the scheduled onboarding adds every listed node again each minute)."""
    disabled = (set(view.disabled_engines) | set(req.disable_engines)) - set(req.enable_engines)
    return sorted(disabled)


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
        last_signed = view.last_signed_at_ms
        # No patch needed: histories of before keys hold no key identity, so take this path never.
        if is_key_identity(reg.identity):
            identity = reg.identity if not is_key_identity(view.identity) else view.identity
            last_signed = max(last_signed, reg.signed_at_ms)
    else:
        last_signed = reg.signed_at_ms if is_key_identity(reg.identity) else 0
    return NodeView(
        record=record,
        boot_id=reg.boot_id,
        identity=identity,
        last_signed_at_ms=last_signed,
        operator_labels=operator_labels,
        disabled_engines=view.disabled_engines if view is not None else [],
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
