"""Imports from Ollama started from the web console or `llmgw top`'s `i` key: `llmgw model
import-ollama NAME[:TAG] [--as MODEL] [--mirror]` run by the gateway (or by top), through the
CLI's own steps (workers/commands/model.py `import_ollama`): the import's arguments parsed by
the CLI's own parser, the plan and its checks (workers/ollama/model_import.py, the catalog's
`validate_model`), the verified copy into `<state>/models/`, with `--mirror` the same model into
the mirror under the model's name (workers/ollama/mirror_add.py), then the definition.

Bad input is refused before anything is copied, in words: a malformed name or tag, a model or
tag the Ollama store lacks, a definition the catalog refuses, a model name already defined or
already being imported. For the web console the copy runs in the background (gigabytes take
minutes; `start`); its progress (bytes of every file) and its end are kept here for the
console's mirror page, the latest MAX_KEPT imports. `llmgw top` awaits the same steps (`run`),
its status line told the progress.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

from pydantic import ValidationError

from activities.control.mirror.errors import MirrorError
from activities.control.mirror.sources import OllamaSource
from activities.control.mirror.store import MirrorStore
from gateway.console.source import ConsoleRefused
from workers.commands.model import add_import_parser
from workers.console_mirror import ImportView
from workers.ollama.mirror_add import add_ollama
from workers.ollama.model_import import ImportPlan, fetch_blobs, plan_import
from workers.ollama.store import NotInStore, OllamaStoreError
from workflows.catalog import CatalogError, validate_model
from workflows.contracts import ModelSpec

IMPORT_COMMAND = "import-ollama"
# Imports shown on the page, the running ones and the latest ended.
MAX_KEPT = 20
RUNNING = ("copying", "mirroring", "defining")

Apply = Callable[[ModelSpec], Awaitable[object]]
DefinedNames = Callable[[], Awaitable[set[str]]]
# Told the import's view as it goes (from the copy's thread).
Told = Callable[[ImportView], None]


class ImportStopped(Exception):
    """Raised in the copy's thread, between two chunks, once the awaited import is cancelled."""


def import_arguments(
    reference: str, as_name: str, mirror: bool, ollama_store: str | None
) -> argparse.Namespace:
    """The arguments `llmgw model import-ollama` would have, from the CLI's own parser, so an
    import from the console gets the CLI's defaults (replicas, cores, memory, context)."""
    parser = argparse.ArgumentParser(add_help=False)
    sub = parser.add_subparsers(dest="action")
    add_import_parser(sub, argparse.ArgumentParser(add_help=False))
    words = [f"--as={as_name}"] if as_name else []
    words += ["--mirror"] if mirror else []
    words += [f"--store={ollama_store}"] if ollama_store else []
    # `--` first: a reference that starts with "-" is a reference, refused as a name, not an
    # option.
    return sub.choices[IMPORT_COMMAND].parse_args([*words, "--", reference])


class OllamaImports:
    """The imports this process (the gateway, or `llmgw top`) runs, by model name. `apply`
    defines the model (the model workflow's `apply`), `defined` answers the names already
    defined."""

    def __init__(
        self,
        models_dir: Path,
        mirror_dir: Path,
        apply: Apply,
        defined: DefinedNames,
        ollama_store: str | None = None,
    ) -> None:
        self._models_dir = models_dir
        self._mirror_dir = mirror_dir
        self._apply = apply
        self._defined = defined
        self._ollama_store = ollama_store
        self._jobs: dict[str, ImportView] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def views(self) -> list[ImportView]:
        """The imports, the latest first, each a copy (a copy's thread updates its own)."""
        return [job.model_copy() for job in reversed(self._jobs.values())]

    async def start(self, reference: str, as_name: str, mirror: bool) -> str:
        """Check the import and start it in the background (the web console's way): the page
        follows it in `views()`."""
        plan, job, ollama_store = await self._checked(reference, as_name, mirror)
        task = asyncio.create_task(self._run(plan, job, ollama_store))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return f"importing ollama {job.reference} as model {plan.spec.name}"

    async def run(
        self, reference: str, as_name: str, mirror: bool, told: Told | None = None
    ) -> ImportView:
        """The same import, checked the same way, awaited to its end (`llmgw top`'s way: its
        status line follows it through `told`, from the copy's thread). Bad input raises
        ConsoleRefused before anything is copied; a failure after is the view's state and
        detail. Cancelled during the copy, the copy stops at its next chunk, its partial file
        removed, rather than the caller waiting for gigabytes on its way out."""
        plan, job, ollama_store = await self._checked(reference, as_name, mirror)
        stop = threading.Event()
        try:
            await self._run(plan, job, ollama_store, told, stop)
        except asyncio.CancelledError:
            stop.set()
            job.state, job.detail = "failed", "stopped"
            raise
        return job.model_copy()

    async def _checked(
        self, reference: str, as_name: str, mirror: bool
    ) -> tuple[ImportPlan, ImportView, str | None]:
        """The import's plan and its view, kept; refused in words (ConsoleRefused) before
        anything is copied."""
        args = import_arguments(reference, as_name, mirror, self._ollama_store)
        try:
            plan = await asyncio.to_thread(plan_import, args, self._models_dir, {})
        except NotInStore as err:
            raise ConsoleRefused(f"ollama {reference}: {err}", status=404) from None
        except OllamaStoreError as err:
            raise ConsoleRefused(f"ollama {reference}: {err}", status=400) from None
        except ValidationError as err:  # the model the import would define, by pydantic
            said = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
            raise ConsoleRefused(f"invalid model: {said}", status=400) from None
        try:
            validate_model(plan.spec)
        except CatalogError as err:
            raise ConsoleRefused(f"invalid model: {err}", status=400) from None
        name = plan.spec.name
        running = self._jobs.get(name)
        if running is not None and running.state in RUNNING:
            raise ConsoleRefused(f"model {name!r} is being imported already")
        if name in await self._defined():
            raise ConsoleRefused(
                f"a model named {name!r} is already defined: import it under another name"
            )
        job = ImportView(
            reference=plan.found.reference.short,
            model=name,
            state="copying",
            mirror=mirror,
            total=sum(b.size for b in plan.blobs),
        )
        self._keep(name, job)
        return plan, job, args.store

    def _keep(self, name: str, job: ImportView) -> None:
        self._jobs.pop(name, None)
        self._jobs[name] = job
        ended = [n for n, j in self._jobs.items() if j.state not in RUNNING]
        for old in ended[: max(0, len(self._jobs) - MAX_KEPT)]:
            del self._jobs[old]

    async def _run(
        self,
        plan: ImportPlan,
        job: ImportView,
        ollama_store: str | None,
        told: Told | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        try:
            await asyncio.to_thread(self._copy, plan, job, ollama_store, told, stop)
            job.state, job.file = "defining", ""
            if told is not None:
                told(job)
            await self._apply(plan.spec)
        except (OllamaStoreError, MirrorError, OSError) as err:
            job.state, job.detail = "failed", str(err)
        except Exception as err:  # noqa: BLE001 - said on the page: the import is over
            job.state, job.detail = "failed", f"the definition was refused: {err}"
        else:
            job.state = "done"
            # The copy's name, not its path: the models directory is the state dir's.
            job.detail = f"model {plan.spec.name} defined on models/{Path(plan.spec.weights).name}"

    def _copy(
        self,
        plan: ImportPlan,
        job: ImportView,
        ollama_store: str | None,
        told: Told | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        """In a thread: the verified copies, every file's bytes counted into the job."""
        copied: dict[str, int] = {}

        def each(what: str, done: int, _total: int | None = None) -> None:
            if stop is not None and stop.is_set():
                raise ImportStopped("stopped: the import was cancelled")
            copied[what] = done
            job.file = what
            job.done = sum(copied.values())
            if told is not None:
                told(job)

        found = plan.found
        # Named by their part of the model, as the mirror names them, not by 64 hex digits.
        kinds = {found.model.digest: "model.gguf"}
        kinds |= {b.digest: "adapter.gguf" for b in found.adapters}
        kinds |= {b.digest: "projector.gguf" for b in found.projectors}
        fetch_blobs(plan, lambda blob, done: each(kinds.get(blob.digest, str(blob)), done))
        job.done = job.total  # a file already there is verified, not copied
        if not job.mirror:
            return
        copied.clear()
        job.state, job.done = "mirroring", 0
        job.total = sum(b.size for b in (found.model, *found.adapters, *found.projectors))
        store = MirrorStore(self._mirror_dir)
        add_ollama(store, OllamaSource(found.reference.short), ollama_store, plan.spec.name, each)
        job.done = job.total
