"""What a restarted agent knows of an engine it did not start: the spec file written per
replica (activities/agent/supervisor.py), as a record. A "launching" record is written before
the process starts, and completed with its pid right after.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engines.adapter import KvPublisher

LAUNCHING = "launching"
RUNNING = "running"


@dataclass(frozen=True)
class ShardSpec:
    replica_id: str
    workflow_id: str
    pid: int
    # /proc/<pid>/stat field 22: with the pid, the process's identity.
    start_time: int
    command: list[str]
    fingerprint: str
    port: int
    log_path: str
    started_at: str = ""
    # The GPUs placement gave the shard: readiness checks each holds memory of its processes.
    gpu_uuids: list[str] = field(default_factory=list)
    # LAUNCHING: written before the process starts (pid 0); RUNNING: pid and start time known.
    # Specs from before launch records have neither field, and are RUNNING.
    phase: str = RUNNING
    launch_id: str = ""
    # Which engine runs (engines/registry.py): its metrics path, for the agent's load reading
    # and drain. Empty in specs written before it was recorded: the default path.
    engine: str = ""
    # Where the engine publishes KV-cache events (engines/adapter.py's KvPublisher, as a dict),
    # for the agent's subscriber; None when it publishes none, and in specs written before it
    # was recorded (their engines are not subscribed to until they restart).
    kv_publisher: dict[str, Any] | None = None
    # The fingerprint without the adapter list (ModelSpec.restart_fingerprint), for an engine
    # that loads adapters while it runs; "" otherwise, and in specs written before it was.
    restart_fingerprint: str = ""
    # Adopted for another adapter list (name -> path on this node) than it serves: the agent
    # loads them, then records `pending_fingerprint` as its fingerprint. None when none wait.
    pending_adapters: dict[str, str] | None = None
    pending_fingerprint: str = ""

    @property
    def launching(self) -> bool:
        return self.phase == LAUNCHING

    def publisher(self) -> KvPublisher | None:
        """The recorded KvPublisher; None when none is, or the record is not one."""
        if not isinstance(self.kv_publisher, dict):
            return None
        try:
            return KvPublisher(**self.kv_publisher)
        except TypeError:
            return None


def load_spec(path: Path) -> ShardSpec | None:
    """The spec in file `path`; None when it is missing or not one."""
    try:
        return ShardSpec(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
