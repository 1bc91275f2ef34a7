"""The replica workflow's pure decisions: how long to back off, how an engine's exit reads in a
view or route, whether a launch was refused over ports another program holds, a new replica's
state, the route a replica publishes, and whether a new definition's adapters can be loaded
into its running engine.

Pure: the replica workflow (workflows/replica/workflow.py) runs them inside the sandbox, and
replays them.
"""

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from workflows import options
    from workflows.contracts import (
        EngineExit,
        ModelSpec,
        PortsInUse,
        ReplicaCarried,
        ReplicaInput,
        ReplicaState,
        ReplicaView,
        Route,
    )

# The agent's refusal to launch on a port a program outside llmgw holds (node_agent.py).
PORT_IN_USE = "PortInUse"

# An exit reason as views and routes show it: one line, short (the agent already redacts it;
# this bounds what a route, read by every gateway, can carry whatever an agent sends).
MAX_REASON = 200


def restart_backoff(consecutive_failures: int) -> timedelta:
    # The exponent is capped before it reaches timedelta: 2**47 seconds overflows it, and a
    # workflow task failing on that would leave a day-long crash loop stuck for good.
    seconds = 2 ** min(max(consecutive_failures - 1, 0), 20)
    return min(timedelta(seconds=seconds), options.RESTART_BACKOFF_MAX)


def taken_ports(err: ActivityError) -> PortsInUse | None:
    """The ports a launch was refused on because another program holds them, if that was why."""
    cause = err.cause
    if not (isinstance(cause, ApplicationError) and cause.type == PORT_IN_USE and cause.details):
        return None
    try:
        return PortsInUse.model_validate(cause.details[0])
    except ValueError:
        return None


def short_reason(exit_info: EngineExit) -> str:
    """One line, at most MAX_REASON characters: the exit's reason, else its code."""
    text = " ".join(exit_info.reason.split())
    if not text:
        text = f"exit code {exit_info.exit_code}" if exit_info.exit_code is not None else "exited"
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"


def new_replica_state(inp: ReplicaInput, parent_workflow_id: str) -> ReplicaCarried:
    """A new replica's state: pending, not placed yet. `parent_workflow_id`: its model's."""
    return ReplicaCarried(
        parent_workflow_id=parent_workflow_id,
        view=ReplicaView(
            replica_id=inp.replica_id, model=inp.model.name, state=ReplicaState.PENDING
        ),
    )


def profile_index(carried: ReplicaCarried) -> int:
    """The profile the replica runs with: its allocation's, the first before it has one."""
    alloc = carried.allocation
    return alloc.profile_index if alloc is not None else 0


def profile_fingerprint(inp: ReplicaInput, carried: ReplicaCarried) -> str:
    return inp.model.profile_fingerprint(profile_index(carried))


def replica_route(inp: ReplicaInput, carried: ReplicaCarried, node: str, endpoint: str) -> Route:
    """The route the replica publishes to the ledger, as its view now stands."""
    profile = inp.model.profiles[profile_index(carried)]
    return Route(
        replica_id=inp.replica_id,
        model=inp.model.name,
        node=node,
        endpoint=endpoint,
        engine=profile.engine,
        state=carried.view.state,
        fingerprint=profile_fingerprint(inp, carried),
        detail=carried.view.detail,
        kv=carried.kv,
        adapters=[adapter.name for adapter in profile.lora],
        prompt_slots=profile.prompt_slots,
        takes_priority=profile.takes_priority,
        slots=profile.slots,
    )


def artifacts_to_fetch(model: ModelSpec, profile: int) -> list[str]:
    """What the replica's nodes fetch from the mirror before it starts: the model's weights and
    the adapters of the profile it was placed with, each once."""
    wanted = [model.artifact] if model.artifact else []
    if 0 <= profile < len(model.profiles):
        wanted += [a.artifact for a in model.profiles[profile].lora if a.artifact]
    return list(dict.fromkeys(wanted))


def takes_adapters_at_runtime(current: ModelSpec, new: ModelSpec, profile: int) -> bool:
    """Whether a replica running `current`'s profile `profile` can serve `new` by loading and
    unloading adapters in its engine: the profile is there in both and differs at most in its
    adapters, on an engine that loads them at runtime (ModelSpec.restart_fingerprint)."""
    if not (0 <= profile < len(current.profiles) and profile < len(new.profiles)):
        return False
    restart = current.restart_fingerprint(profile)
    return bool(restart) and restart == new.restart_fingerprint(profile)


def new_adapter_artifacts(current: ModelSpec, new: ModelSpec, profile: int) -> list[str]:
    """The mirror artifacts of `new`'s adapters on `profile` that `current`'s do not have: what
    the replica's nodes fetch before its engine loads them."""
    held = set(artifacts_to_fetch(current, profile))
    return [a for a in artifacts_to_fetch(new, profile) if a not in held]
