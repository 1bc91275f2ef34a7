"""Node agent activities: what the control plane asks of the agent on a node."""

from __future__ import annotations

from pydantic import BaseModel

from workflows.contracts.ledger import Allocation, KvSource
from workflows.contracts.models import ModelSpec


class DiscoverRequest(BaseModel):
    node: str


class LaunchRequest(BaseModel):
    """Start (or adopt) one engine process for a replica on this node."""

    replica_id: str
    workflow_id: str
    model: ModelSpec
    allocation: Allocation


class LaunchResult(BaseModel):
    pid: int
    adopted: bool
    command: list[str]
    # The engine publishes KV-cache events, and this agent's feed carries them.
    kv: KvSource | None = None


class ReadyRequest(BaseModel):
    replica_id: str
    port: int
    timeout_s: float = 600.0


class ReadyResult(BaseModel):
    ready: bool
    detail: str = ""


class ShardRef(BaseModel):
    replica_id: str
    # On a stop: wait up to this long for the engine's in-flight requests to finish first.
    drain_s: float = 0.0


class StopResult(BaseModel):
    replica_id: str
    was_running: bool
