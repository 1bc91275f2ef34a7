"""What the web console needs from the cluster, as the gateway sees it: a protocol the process
running the gateway fills in (workers/console_cluster.py reads Temporal and the node agents), so
the gateway imports nothing of the control plane and tests hand in a stand-in."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

# The node commands the console offers: the CLI's `llmgw node cordon|uncordon|drain`.
NODE_ACTIONS = ("cordon", "uncordon", "drain")
# However many pages poll, the cluster is read at most this often.
CLUSTER_READ_EVERY_S = 1.0
# A frozen Temporal or agent must not hold every poll.
CLUSTER_READ_TIMEOUT_S = 10.0


class ConsoleRefused(Exception):
    """A command the cluster refused, in its own words (no such node, an update refused)."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


class ClusterConsole(Protocol):
    async def read(self) -> dict[str, Any]:
        """The cluster as JSON-ready data (workers/console_data.ClusterView's shape)."""
        ...

    async def node_command(self, node: str, action: str, reason: str) -> str:
        """One of NODE_ACTIONS; answers what happened, in words, or raises ConsoleRefused."""
        ...

    async def scale(self, model: str, replicas: int) -> str: ...

    async def import_ollama(self, reference: str, name: str, mirror: bool) -> str:
        """`llmgw model import-ollama REFERENCE [--as NAME] [--mirror]`, started: answers what
        started, or raises ConsoleRefused (bad name, no such model or tag, a name taken); the
        import's progress is in what `read` answers (`imports`)."""
        ...


class ClusterCache:
    """The latest cluster reading, shared by every page polling this gateway."""

    def __init__(self, cluster: ClusterConsole) -> None:
        self.cluster = cluster
        self._lock = asyncio.Lock()
        self._data: dict[str, Any] | None = None
        self._at = 0.0
        self._stale = False  # a command since: read again whatever the time

    async def read(self) -> dict[str, Any]:
        async with self._lock:
            fresh = time.monotonic() - self._at < CLUSTER_READ_EVERY_S
            if self._data is None or self._stale or not fresh:
                try:
                    async with asyncio.timeout(CLUSTER_READ_TIMEOUT_S):
                        self._data = await self.cluster.read()
                except Exception as err:  # noqa: BLE001 - shown on the page; polling goes on
                    problem = f"the cluster could not be read: {err or type(err).__name__}"
                    return {**(self._data or {}), "problems": [problem]}
                self._at = time.monotonic()
                self._stale = False
            return self._data

    def forget(self) -> None:
        """After a command: the next poll reads the cluster again (keeping this reading, shown
        should that read fail)."""
        self._stale = True
