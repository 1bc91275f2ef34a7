"""Replicas: the replica workflow's input, messages, view and carried state.

ReplicaCarried names the ledger's Allocation and KvSource, and the ledger's Route names
ReplicaState: the Allocation and KvSource import is for type checkers only, and the package's
__init__ completes ReplicaCarried (and ReplicaInput, which carries it) once both modules are
loaded."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from workflows.contracts.models import ModelSpec

if TYPE_CHECKING:
    from workflows.contracts.ledger import Allocation, KvSource


class ReplicaState(StrEnum):
    PENDING = "pending"  # waiting for a node that can take it
    STARTING = "starting"  # placed; engine process being launched
    LOADING = "loading"  # process up, weights loading (/health or /v1/models not yet OK)
    READY = "ready"  # serving: the only state the gateway routes to
    RESTARTING = "restarting"  # engine exited; waiting out the backoff before starting again
    STOPPING = "stopping"  # draining and stopping on scale-down or removal
    STOPPED = "stopped"  # gone; its resources are released

    @classmethod
    def routable(cls) -> frozenset[ReplicaState]:
        return frozenset({cls.READY})


class ReplicaInput(BaseModel):
    replica_id: str
    model: ModelSpec
    # Set only when a run continues as new: everything the previous run knew.
    carried: ReplicaCarried | None = None


class StopReplica(BaseModel):
    reason: str = "scaled down"
    # The node is lost or removed: nobody there can stop the engine, so do not wait for it (a
    # returning agent stops engines whose replica workflow has ended).
    engine_gone: bool = False


class UpdateAdapters(BaseModel):
    """The model's new definition, sent to a running replica whose engine loads adapters at
    runtime and whose profile changed only in its adapters: it loads and unloads them in the
    engine rather than restart, and serves under this definition from then on."""

    model: ModelSpec


class EngineExit(BaseModel):
    """An engine process ended (or was found gone). Sent as the supervise activity's result and,
    when an agent restarts and finds a shard dead, as a signal to the replica workflow."""

    replica_id: str
    exit_code: int | None = None
    # The exit and at most one redacted line of the engine's log (activities/agent/exit_reason.py).
    # The log itself stays on the node: it can hold prompts, and this lands in history. Old
    # histories' `log_tail` is ignored on decoding (pydantic drops unknown fields).
    reason: str = ""


class ReplicaView(BaseModel):
    replica_id: str
    model: str
    state: ReplicaState
    node: str | None = None
    restarts: int = 0
    detail: str = ""
    # Why it last left a node on its own ("re-placed after 5 failures on n1: ..."); "" if never.
    moved: str = ""


class ReplicaPhase(StrEnum):
    """Where a replica workflow is in its life: what a continued run resumes with."""

    PLACING = "placing"  # no allocation: ask the ledger for one (and wait for room)
    RUNNING = "running"  # allocated: start (or adopt) the engine, supervise, restart on exit
    MOVING = "moving"  # crash-looping on its node: stop the engine, release, place elsewhere
    STOPPING = "stopping"  # told to stop: stop the engine, release, end


class ReplicaCarried(BaseModel):
    """The replica workflow's whole state, carried through continue-as-new. No engine log is
    ever in it (it lands in history; a log can hold prompts)."""

    # The model workflow to tell `replica_ready`: workflow.info().parent is a run's, not the
    # replica's, and is not what a continued run can rely on.
    parent_workflow_id: str = ""
    phase: ReplicaPhase = ReplicaPhase.PLACING
    allocation: Allocation | None = None
    view: ReplicaView
    # Engine runs that failed in a row, none after a run long enough to reset the backoff.
    failures: int = 0
    # Of those, how many on the node it runs on now, and the last one's reason.
    failures_on_node: int = 0
    last_failure: str = ""
    # Nodes the next placement avoids (the one it is moving away from).
    exclude_nodes: list[str] = Field(default_factory=list)
    # Node -> ports a program outside llmgw was found holding there: placement skips them.
    taken_ports: dict[str, list[int]] = Field(default_factory=dict)
    stop: StopReplica | None = None
    exit_report: EngineExit | None = None
    # A new definition its model sent (UpdateAdapters), not taken yet: its adapters are loaded
    # once the engine serves, or it is launched with them.
    next_model: ModelSpec | None = None
    # Where the leader's KV-cache events can be read, as its last launch reported it.
    kv: KvSource | None = None
    # The placement and stop retry ladders: the next wait.
    placement_wait_s: float = 1.0
    stop_wait_s: float = 0.0
    # Its allocation was held before this run began (a predecessor under the same ID was
    # terminated, cancelled or reset): the engine there may still serve, so the next launch
    # adopts it without taking its route out of service first (workflows/replica/adoption.py).
    adopt: bool = False
