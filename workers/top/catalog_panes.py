"""`llmgw top`'s Models and Mirror panes drawn as lines (pure, as workers/top/render.py): the
catalog's models with the replicas wanted and ready, and what the control plane's mirror holds
with the nodes' fetches in progress below it."""

from __future__ import annotations

from workers.commands.mirror import human
from workers.fetch_progress import short_digest
from workers.tables import table
from workers.top.data import TopData

# A selected row is marked in a gutter of its own, so the columns do not move.
MARK = "> "
GUTTER = "  "


def models_pane(data: TopData, selected: int) -> list[str]:
    rows = []
    for model in data.catalog:
        note = "removing" if model.removing else ""
        if model.external:
            note = note or "external: not scaled by replicas"
        rows.append([model.name, str(model.wanted), str(model.ready), model.engine, note])
    if not rows:
        return [GUTTER + "no model defined (llmgw model add, or i in the Mirror pane)"]
    lines = table(["MODEL", "WANTED", "READY", "ENGINE", "NOTE"], rows).splitlines()
    return [
        GUTTER + lines[0],
        *((MARK if i == selected else GUTTER) + line for i, line in enumerate(lines[1:])),
    ]


def _size(size: int | None) -> str:
    return "?" if size is None else human(size)


def mirror_pane(data: TopData) -> list[str]:
    """The mirror's names, then the fetches in progress; the column headings first (they stay
    when the rows scroll)."""
    rows = [
        [
            a.name,
            short_digest(a.digest),
            _size(a.size),
            str(a.files) if a.size is not None else "?",
            ", ".join(a.models) or "-",
            a.problem or a.source,
        ]
        for a in data.mirror
    ]
    headers = ["NAME", "ARTIFACT", "SIZE", "FILES", "USED BY", "SOURCE"]
    lines = table(headers, rows).splitlines()
    where = f" at {data.mirror_dir}" if data.mirror_dir else ""
    if not rows:
        lines.append(f"the mirror{where} is empty: i imports a model from Ollama")
    else:
        # Names may share an artifact: its files are stored once.
        total = sum({a.digest: a.size or 0 for a in data.mirror}.values())
        lines.append(f"{len(rows)} name(s), {human(total)} in the mirror{where}")
    lines += ["", "Fetches onto nodes in progress:"]
    if data.fetches:
        fetch_cells = [
            [f.node, f.artifact, f.model, f.state, f.progress, f.detail] for f in data.fetches
        ]
        headers = ["NODE", "ARTIFACT", "MODEL", "STATE", "PROGRESS", "DETAIL"]
        lines += table(headers, fetch_cells).splitlines()
    else:
        lines.append("no fetch running")
    return lines
