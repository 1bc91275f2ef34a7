"""Node agent activities: what the control plane asks of the agent on a node."""

from __future__ import annotations

from pydantic import BaseModel, Field

from workflows.contracts.ledger import Allocation, KvSource
from workflows.contracts.models import LoraAdapter, ModelSpec


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


class SetAdaptersRequest(BaseModel):
    """Make a running engine serve exactly these LoRA adapters, loading and unloading them
    through its runtime endpoints (engines/adapter.py RuntimeAdapters)."""

    replica_id: str
    model: str
    # As the profile names them: an adapter with an artifact is found in it on the node.
    adapters: list[LoraAdapter] = Field(default_factory=list)


class SetAdaptersResult(BaseModel):
    # Name -> path of every adapter the engine serves now, as it was given the path (the KV
    # router keys an adapter's blocks by both: gateway/routing/kv_blocks.py).
    adapters: dict[str, str] = Field(default_factory=dict)
    loaded: list[str] = Field(default_factory=list)
    unloaded: list[str] = Field(default_factory=list)
