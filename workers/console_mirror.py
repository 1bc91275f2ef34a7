"""The web console's mirror page as plain data: each name in the control plane's mirror with its
artifact's size and files, the models whose weights or adapters are that artifact, the nodes
holding it whole and those fetching it now; and the imports from Ollama the console started.

Pure, like workers/console_data.py: the names come from `llmgw mirror ls`' own reading
(workers/commands/mirror.mirror_entries), read by workers/console_cluster.py; which models use
an artifact is the rule `llmgw top`'s Mirror pane uses too (workers/commands/mirror.artifacts_used).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from workers.commands.mirror import MirrorEntry, artifacts_used
from workers.fetch_progress import FetchStatus
from workflows.artifact_names import artifact_hint
from workflows.contracts import ModelView, NodeRecord


class ArtifactView(BaseModel):
    name: str
    digest: str
    size: int | None = None  # bytes; None: the manifest could not be read
    files: list[str] = Field(default_factory=list)
    source: str = ""
    models: list[str] = Field(default_factory=list)  # defined by it (weights or an adapter)
    held_on: list[str] = Field(default_factory=list)  # nodes whose agent holds it whole
    fetching_on: list[str] = Field(default_factory=list)  # nodes fetching it now
    problem: str = ""


class MirrorView(BaseModel):
    # False where this gateway's machine has no mirror (it runs elsewhere): nothing to list.
    here: bool = False
    artifacts: list[ArtifactView] = Field(default_factory=list)
    # Bytes the names reference, each distinct file once (the mirror stores each once).
    stored: int = 0


class ImportView(BaseModel):
    """An import from Ollama the console started, as it goes."""

    reference: str  # NAME[:TAG] as Ollama names it
    model: str  # the llmgw model it defines
    # copying (into the models directory), mirroring, defining, done or failed
    state: str
    mirror: bool = False  # also into the mirror (`import-ollama --mirror`)
    file: str = ""  # the file being copied
    done: int = 0  # bytes of the import copied so far, every file counted
    total: int = 0
    detail: str = ""  # why it failed, or what it defined


def mirror_view(
    entries: list[MirrorEntry] | None,
    models: list[ModelView],
    nodes: dict[str, NodeRecord],
    fetches: list[FetchStatus],
) -> MirrorView:
    """`entries` None: no mirror on this machine."""
    if entries is None:
        return MirrorView()
    used = artifacts_used(models)
    fetching: dict[str, set[str]] = {}
    for status in fetches:
        fetching.setdefault(status.view.manifest, set()).add(status.view.node)
    views = []
    blobs: dict[str, int] = {}
    for name, digest, manifest in sorted(entries):
        if isinstance(manifest, str):
            views.append(ArtifactView(name=name, digest=digest, problem=manifest))
            continue
        hint = artifact_hint(digest)
        blobs.update((f.digest, f.size) for f in manifest.files)
        views.append(
            ArtifactView(
                name=name,
                digest=digest,
                size=manifest.size,
                files=[f.path for f in manifest.files],
                source=manifest.source,
                models=used.get(digest, []),
                held_on=sorted(n for n, r in nodes.items() if hint in r.inventory.artifacts),
                fetching_on=sorted(fetching.get(digest, set())),
            )
        )
    return MirrorView(here=True, artifacts=views, stored=sum(blobs.values()))
