"""What `llmgw top`'s actions do (workers/top/keys.py's `Action`), through the code the CLI and
the web console run: cordon, uncordon and drain are `llmgw node cordon|uncordon|drain`
(workers/commands/node.py's send_node_command), scale is `llmgw model scale`
(workflows/model/client.py's scale_model), both reached as the web console reaches them
(workers/console_cluster.py); the Ollama import is `llmgw mirror add ollama://NAME[:TAG]`
(workers/ollama/mirror_add.py) into the mirror the Mirror pane shows.

Each returns the line the status line shows, or raises `ActionRefused` with what was refused
and why, in the cluster's own words.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from temporalio.client import Client

from activities.control.mirror.errors import MirrorError
from activities.control.mirror.sources import OllamaSource
from activities.control.mirror.store import MirrorStore
from gateway.console.source import ConsoleRefused
from store.fleet import FleetTables
from workers.commands.mirror import human
from workers.console_cluster import TemporalClusterConsole
from workers.ollama.mirror_add import add_ollama
from workers.top.keys import NODE_ACTIONS, Action

# How far an import got, as a line: the console shows the latest in its status line.
Progress = Callable[[str], None]


class ActionRefused(Exception):
    """An action the cluster (or the mirror) refused, with why."""


class Operator(Protocol):
    async def run(self, action: Action, progress: Progress) -> str: ...


class NoOperator:
    """A console without a cluster to act on (the stand-in source of the tmux tests)."""

    async def run(self, action: Action, progress: Progress) -> str:  # noqa: ARG002
        raise ActionRefused("this console reads a stand-in source: there is no cluster to act on")


class LiveOperator:
    def __init__(
        self, client: Client, fleet: FleetTables, mirror_dir: Path, ollama_store: str | None
    ) -> None:
        self._cluster = TemporalClusterConsole(client, fleet)
        self._mirror_dir = mirror_dir
        self._ollama_store = ollama_store  # None: $OLLAMA_MODELS or ~/.ollama/models

    async def run(self, action: Action, progress: Progress) -> str:
        try:
            if action.verb in NODE_ACTIONS:
                return await self._cluster.node_command(action.target, action.verb, action.value)
            if action.verb == "scale":
                return await self._cluster.scale(action.target, int(action.value))
        except ConsoleRefused as err:
            raise ActionRefused(str(err)) from None
        if action.verb == "import":
            # Hashing and copying gigabytes: in a thread, so the keys and refreshes go on.
            stop = threading.Event()
            try:
                return await asyncio.to_thread(self._import, action.value, progress, stop)
            except asyncio.CancelledError:
                # `q` during a copy: the thread stops at its next chunk, its partial file
                # removed, rather than the console waiting for gigabytes on its way out.
                stop.set()
                raise
        raise ActionRefused(f"no action {action.verb!r}")

    def _import(self, reference: str, progress: Progress, stop: threading.Event) -> str:
        def each(what: str, done: int, total: int | None) -> None:
            if stop.is_set():
                raise ActionRefused("stopped: the console quit")
            share = f"{done * 100 // total}% of {human(total)}" if total else human(done)
            progress(f"importing ollama://{reference}: {what} {share}")

        try:
            store = MirrorStore(self._mirror_dir)
            added = add_ollama(store, OllamaSource(reference), self._ollama_store, None, each)
        except MirrorError as err:
            raise ActionRefused(str(err)) from None
        new = f"{human(added.new_bytes)} new" if added.new_bytes else "nothing new"
        return (
            f"imported {reference} as {added.name} ({new}); to serve it: "
            f"llmgw model add {added.name} --from ollama://{reference}"
        )
