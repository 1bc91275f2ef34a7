"""What `llmgw top`'s actions do (workers/top/keys.py's `Action`), through the code the CLI and
the web console run, reached as the web console reaches them (workers/console_cluster.py):
cordon, uncordon and drain are `llmgw node cordon|uncordon|drain` (workers/commands/node.py's
send_node_command), scale is `llmgw model scale` (workflows/model/client.py's scale_model), and
the Ollama import is the console's `llmgw model import-ollama NAME[:TAG] [--as MODEL] --mirror`
(workers/console_import.py): the model copied verified into the state dir, into the mirror the
Mirror pane shows, and defined.

Each returns the line the status line shows, or raises `ActionRefused` with what was refused
and why, in the cluster's (or the web console's) own words.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from temporalio.client import Client

from gateway.console.source import ConsoleRefused
from store.fleet import FleetTables
from workers.commands.mirror import human
from workers.console_cluster import TemporalClusterConsole
from workers.console_mirror import ImportView
from workers.paths import Locations
from workers.top.keys import NODE_ACTIONS, Action, import_words

# How far an import got, as a line: the console shows the latest in its status line.
Progress = Callable[[str], None]


class ActionRefused(Exception):
    """An action the cluster (or the import's checks) refused, with why."""


class ActionFailed(Exception):
    """An action that was taken and went wrong on its way (an import's copy or definition)."""


class Operator(Protocol):
    async def run(self, action: Action, progress: Progress) -> str: ...


class NoOperator:
    """A console without a cluster to act on (the stand-in source of the tmux tests)."""

    async def run(self, action: Action, progress: Progress) -> str:  # noqa: ARG002
        raise ActionRefused("this console reads a stand-in source: there is no cluster to act on")


def import_line(job: ImportView) -> str:
    """The status line of an import as it goes: `importing ollama smollm2:135m as model
    smollm2-135m: copying model.gguf 40% of 91.7 MiB`."""
    said = f"importing ollama {job.reference} as model {job.model}: {job.state}"
    if job.state in ("copying", "mirroring") and job.file:
        share = f"{job.done * 100 // job.total}% of {human(job.total)}" if job.total else ""
        said += f" {job.file} {share}".rstrip()
    return said


class LiveOperator:
    def __init__(
        self, client: Client, fleet: FleetTables, where: Locations, ollama_store: str | None
    ) -> None:
        # The web console's own view of the cluster, its imports included (into this
        # machine's state dir: top runs beside `llmgw up`, as the gateway's console does).
        self._cluster = TemporalClusterConsole(
            client, fleet, where=where, ollama_store=ollama_store
        )

    async def run(self, action: Action, progress: Progress) -> str:
        try:
            if action.verb in NODE_ACTIONS:
                return await self._cluster.node_command(action.target, action.verb, action.value)
            if action.verb == "scale":
                return await self._cluster.scale(action.target, int(action.value))
            if action.verb == "import":
                return await self._import(action.value, progress)
        except ConsoleRefused as err:
            raise ActionRefused(str(err)) from None
        raise ActionRefused(f"no action {action.verb!r}")

    async def _import(self, value: str, progress: Progress) -> str:
        try:
            reference, as_name = import_words(value)
        except ValueError as err:
            raise ActionRefused(str(err)) from None
        imports = self._cluster.imports
        assert imports is not None  # made with a state dir
        # Awaited, the keys and refreshes going on; `q` meanwhile cancels it, and the copy
        # stops at its next chunk, its partial file removed.
        job = await imports.run(reference, as_name, True, lambda j: progress(import_line(j)))
        if job.state != "done":
            raise ActionFailed(job.detail)
        # The model's name twice: defined under it, and the mirror's name for it.
        model = job.model
        return f"imported ollama {job.reference}: model {model} defined, in the mirror as {model}"
