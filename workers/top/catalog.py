"""`llmgw top`'s Models and Mirror panes as plain data: the catalog's models with their ready
replicas, each name in the control plane's mirror with the models that use its artifact, and
the nodes' fetches in progress, from what `llmgw model list`, `llmgw mirror ls` and `llmgw
fetches` read. Pure: workers/top/source.py reads, tests hand these functions made-up readings.
"""

from __future__ import annotations

from collections.abc import Iterable

from workers.commands.mirror import MirrorEntry
from workers.fetch_progress import FetchStatus, fetch_row
from workers.top.data import ArtifactRow, FetchRow, ModelRow
from workflows.catalog import EXTERNAL
from workflows.contracts import ModelView, Route


def model_rows(views: Iterable[ModelView], routes: Iterable[Route]) -> list[ModelRow]:
    ready: dict[str, int] = {}
    for route in routes:
        if route.state.value == "ready":
            ready[route.model] = ready.get(route.model, 0) + 1
    rows = []
    for view in sorted(views, key=lambda v: v.spec.name):
        spec = view.spec
        engines = sorted({p.engine for p in spec.profiles})
        rows.append(
            ModelRow(
                name=spec.name,
                wanted=spec.replicas,
                ready=ready.get(spec.name, 0),
                engine=",".join(engines),
                external=EXTERNAL in engines,
                removing=view.removing,
            )
        )
    return rows


def artifact_rows(entries: Iterable[MirrorEntry], used: dict[str, list[str]]) -> list[ArtifactRow]:
    """`mirror_entries`' names (name, digest, manifest or why unreadable) as rows."""
    rows = []
    for name, digest, manifest in sorted(entries):
        if isinstance(manifest, str):
            rows.append(ArtifactRow(name=name, digest=digest, problem=manifest))
            continue
        rows.append(
            ArtifactRow(
                name=name,
                digest=digest,
                size=manifest.size,
                files=len(manifest.files),
                source=manifest.source,
                models=used.get(digest, []),
            )
        )
    return rows


def fetch_rows(statuses: Iterable[FetchStatus]) -> list[FetchRow]:
    """The fetches as `llmgw fetches` words them (workers/fetch_progress.py's fetch_row)."""
    rows = []
    for status in statuses:
        node, artifact, model, state, progress, detail = fetch_row(status)
        rows.append(
            FetchRow(
                node=node,
                artifact=artifact,
                model=model,
                state=state,
                progress=progress,
                detail=detail,
            )
        )
    return rows
