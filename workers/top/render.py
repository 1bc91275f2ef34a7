"""`llmgw top` drawn as text: a pure function from what was read and the operator's choices
(pane, sort, scroll, the selected row, a prompt: workers/top/keys.py) to the screen's lines for
a given width and height. workers/top/console.py puts the lines on a curses screen; tests read
them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from workers.tables import table
from workers.top.catalog_panes import GUTTER, MARK, mirror_pane, models_pane
from workers.top.data import (
    GpuRow,
    KeyQuota,
    ModelCounters,
    ModelRates,
    NodeRow,
    ReplicaRow,
    TopData,
)
from workers.top.keys import PANES, SELECTABLE, UiState

_GIB = 1024**3


@dataclass(frozen=True)
class Screen:
    """One refresh's worth: the data (None before the first reading), the rates worked out
    against the refresh before, and when it was read."""

    data: TopData | None
    rates: list[ModelRates]
    refreshed: str = ""  # "12:00:01"
    every_s: float = 2.0
    reading: bool = False  # a refresh is under way


# Figures --------------------------------------------------------------------------------


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _gib(used: float | None, total: float | None) -> str:
    if used is None or not total:
        return "-"
    return f"{used / _GIB:.0f}/{total / _GIB:.0f}"


def _temp(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}C"


def _watts(power: float | None, limit: float | None) -> str:
    if power is None:
        return "-"
    return f"{power:.0f}/{limit:.0f}" if limit else f"{power:.0f}"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _known(values: Sequence[float | None]) -> list[float]:
    return [v for v in values if v is not None]


def _node_util(node: NodeRow) -> float | None:
    values = _known([g.utilization_pct for g in _cards(node)])
    return sum(values) / len(values) if values else None


def _sum(values: Sequence[float | None]) -> float | None:
    known = _known(values)
    return sum(known) if known else None


def _cards(node: NodeRow) -> list[GpuRow]:
    return [g for g in node.gpus if g.parent is None]


def _node_memory_share(node: NodeRow) -> float:
    used = _sum([g.memory_used for g in _cards(node)]) or 0.0
    total = _sum([g.memory_total for g in _cards(node)]) or 0.0
    return used / total if total else 0.0


def _node_temp(node: NodeRow) -> float | None:
    temps = _known([g.temperature_c for g in _cards(node)])
    return max(temps) if temps else None


# Panes ----------------------------------------------------------------------------------


def _node_state(node: NodeRow) -> str:
    if node.draining:
        return f"{node.state},draining"
    return f"{node.state},cordoned" if node.cordoned else node.state


def node_order(data: TopData, sort: str) -> list[NodeRow]:
    def by(key: Callable[[NodeRow], float]) -> list[NodeRow]:
        return sorted(data.nodes, key=lambda n: (-key(n), n.name))

    if sort == "util":
        return by(lambda n: _node_util(n) or 0.0)
    if sort == "memory":
        return by(_node_memory_share)
    if sort == "temperature":
        return by(lambda n: _node_temp(n) or 0.0)
    return sorted(data.nodes, key=lambda n: n.name)


def _nodes(data: TopData, sort: str, selected: int) -> tuple[list[str], int]:
    """The pane's lines, and which of the rows below the headings is the selected node's."""
    rows = []
    marks = []
    for i, node in enumerate(node_order(data, sort)):
        cards = _cards(node)
        marks.append(MARK if i == selected else GUTTER)
        rows.append(
            [
                node.name,
                _node_state(node),
                str(len(cards)) if cards else ("?" if node.telemetry_problem else "0"),
                _pct(_node_util(node)),
                _gib(_sum([g.memory_used for g in cards]), _sum([g.memory_total for g in cards])),
                _temp(_node_temp(node)),
                _watts(_sum([g.power_w for g in cards]), _sum([g.power_limit_w for g in cards])),
                "; ".join(n for n in (node.note, node.telemetry_problem) if n),
            ]
        )
        for gpu in node.gpus:
            label = f"  gpu {gpu.index}" if gpu.parent is None else f"    mig {gpu.index}"
            marks.append(GUTTER)
            rows.append(
                [
                    label,
                    gpu.name,
                    "",
                    _pct(gpu.utilization_pct),
                    _gib(gpu.memory_used, gpu.memory_total),
                    _temp(gpu.temperature_c),
                    _watts(gpu.power_w, gpu.power_limit_w),
                    gpu.warning,
                ]
            )
    headers = ["NODE", "STATE", "GPUS", "UTIL", "MEM GiB", "TEMP", "POWER W", "NOTE"]
    lines = table(headers, rows).splitlines()
    marked = [mark + line for mark, line in zip([GUTTER, *marks], lines, strict=True)]
    return marked, marks.index(MARK) if MARK in marks else 0


def selectable(data: TopData | None, ui: UiState) -> list[str]:
    """The rows an action can pick in this pane (node or model names), in the order shown."""
    if data is None or ui.pane_name not in SELECTABLE:
        return []
    if ui.pane_name == "Nodes":
        return [n.name for n in node_order(data, ui.sort_name)]
    return [m.name for m in data.catalog]


def _load(replica: ReplicaRow) -> float:
    return (replica.running or 0.0) + (replica.waiting or 0.0)


def _replicas(data: TopData, sort: str) -> list[str]:
    keys: dict[str, Callable[[ReplicaRow], tuple[object, ...]]] = {
        "name": lambda r: (r.replica_id,),
        "model": lambda r: (r.model, r.replica_id),
        "state": lambda r: (r.state, r.replica_id),
        "load": lambda r: (-_load(r), r.replica_id),
    }
    rows = [
        [
            r.replica_id,
            r.model,
            r.state,
            r.node,
            r.engine,
            _num(r.running, 0),
            _num(r.waiting, 0),
            _num(data.replica_depths.get(r.replica_id), 0),
            r.detail,
        ]
        for r in sorted(data.replicas, key=keys[sort])
    ]
    headers = [
        "REPLICA",
        "MODEL",
        "STATE",
        "NODE",
        "ENGINE",
        "RUNNING",
        "WAITING",
        "DEPTH",
        "DETAIL",
    ]
    return table(headers, rows).splitlines()


def _budget(key: KeyQuota) -> str:
    if key.token_budget is None:
        return "-"
    share = key.budget_spent / key.token_budget
    return f"{key.budget_spent}/{key.token_budget} {share:.0%} per {key.budget_period}"


def _traffic(data: TopData, rates: list[ModelRates], sort: str) -> list[str]:
    if sort == "name":
        ordered = sorted(rates, key=lambda r: r.model)
    else:
        ordered = sorted(rates, key=lambda r: (-(r.requests_per_s or 0.0), r.model))
    model_rows = [
        [
            r.model,
            _num(r.requests_per_s),
            _num(r.tokens_per_s, 0),
            _pct(None if r.error_share is None else 100 * r.error_share),
            _pct(None if r.cache_share is None else 100 * r.cache_share),
            _state(r),
            _pct(None if r.incorrect_share is None else 100 * r.incorrect_share),
        ]
        for r in ordered
    ]
    model_headers = ["MODEL", "REQ/S", "TOK/S", "ERRORS", "CACHE HITS", "ROUTING", "MISROUTED"]
    lines = table(model_headers, model_rows).splitlines()

    def spent(key: KeyQuota) -> float:
        return key.budget_spent / key.token_budget if key.token_budget else 0.0

    keys = sorted(data.keys, key=lambda k: (-spent(k), k.name))
    key_rows = [
        [
            k.name,
            str(k.requests_today),
            str(k.tokens_today),
            _budget(k),
            str(k.rpm) if k.rpm else "-",
            str(k.tpm) if k.tpm else "-",
        ]
        for k in keys
    ]
    headers = ["KEY", "REQUESTS TODAY", "TOKENS TODAY", "TOKEN BUDGET", "RPM", "TPM"]
    return [*lines, *_waiting(data), "", *table(headers, key_rows).splitlines()]


def _state(rates: ModelRates) -> str:
    """The routing state most choices since the last refresh were in, and its share."""
    if rates.state is None or rates.state_share is None:
        return "-"
    return f"{rates.state} {100 * rates.state_share:.0f}%"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _refusals(model: ModelCounters) -> str:
    said = {"queue_full": "queue full (429)", "queue_timeout": "queue timeout (503)"}
    counts = [
        f"{count:.0f} {said.get(reason, reason)}"
        for reason, count in sorted(model.queue_refused.items())
        if count
    ]
    return f"{model.model}: " + ", ".join(counts) if counts else ""


def _waiting(data: TopData) -> list[str]:
    """Who waits in the gateway's fair queue for what, and what the queue refused since the
    gateway started; nothing when neither."""
    refused = [line for m in sorted(data.models, key=lambda m: m.model) if (line := _refusals(m))]
    if not data.waiting and not refused:
        return []
    lines = ["", "Waiting in the gateway's fair queue:"]
    cells = [
        [w.model, w.key, w.priority, _num(w.waiting, 0), _seconds(w.oldest_s)] for w in data.waiting
    ]
    if cells:
        lines += table(["MODEL", "KEY", "CLASS", "WAITING", "OLDEST"], cells).splitlines()
    else:
        lines.append("nothing waits")
    if refused:
        lines.append("Refused since the gateway started: " + "; ".join(refused))
    return lines


# The screen -----------------------------------------------------------------------------


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"


def _summary(screen: Screen) -> str:
    data = screen.data
    if data is None:
        return "llmgw top  reading..."
    gpus = sum(len(_cards(n)) for n in data.nodes)
    ready = sum(1 for r in data.replicas if r.state == "ready")
    rates = [r.requests_per_s for r in screen.rates if r.requests_per_s is not None]
    parts = [
        "llmgw top",
        _count(len(data.nodes), "node"),
        _count(gpus, "GPU"),
        f"{ready}/{len(data.replicas)} replicas ready",
        f"{sum(rates):.1f} req/s" if rates else "- req/s",
    ]
    if data.in_flight is not None:
        parts.append(f"{data.in_flight:.0f} in flight")
    if data.waiting:
        parts.append(f"{sum(w.waiting for w in data.waiting):.0f} waiting")
    refreshed = f"refreshed {screen.refreshed}" if screen.refreshed else ""
    parts.append(f"{refreshed}, every {screen.every_s:g}s" + (" *" if screen.reading else ""))
    return "  ".join(parts)


def _tabs(ui: UiState) -> str:
    tabs = " ".join(f"[{p}]" if i == ui.pane else f" {p} " for i, p in enumerate(PANES))
    return f"{tabs}   sort: {ui.sort_name}"


def _fit(line: str, width: int) -> str:
    return line[:width].ljust(width)


def _body(data: TopData, screen: Screen, ui: UiState) -> tuple[list[str], int | None]:
    """The pane's lines (column headings first), and which of the rows below the headings is
    the selected one in a pane where rows are picked (None elsewhere)."""
    picked = min(ui.selected, max(0, len(selectable(data, ui)) - 1))
    if ui.pane_name == "Nodes":
        return _nodes(data, ui.sort_name, picked)
    if ui.pane_name == "Replicas":
        return _replicas(data, ui.sort_name), None
    if ui.pane_name == "Traffic":
        return _traffic(data, screen.rates, ui.sort_name), None
    if ui.pane_name == "Models":
        return models_pane(data, picked), picked
    return mirror_pane(data), None


def render(screen: Screen, ui: UiState, width: int, height: int) -> list[str]:
    """Exactly `height` lines of exactly `width` characters."""
    if width <= 0 or height <= 0:
        return []
    data = screen.data
    problems = data.problems if data is not None else []
    head = [_summary(screen), _tabs(ui)]
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        head.append(f"! {problems[0]}{more}")
    else:
        head.append("")
    body, picked_line = _body(data, screen, ui) if data is not None else ([], None)
    foot = ui.foot
    room = max(0, height - len(head) - len(foot))
    if body:
        # The column headings stay; the rows below them scroll (to the selected row, in a
        # pane where rows are picked).
        heading, rows = body[0], body[1:]
        shown = max(0, room - 1)
        start = ui.scroll if picked_line is None else max(0, picked_line - (shown - 1))
        start = min(start, max(0, len(rows) - shown))
        body = [heading, *rows[start : start + shown]]
    lines = [*head, *body[:room]]
    lines += [""] * (height - len(foot) - len(lines))
    lines += foot
    return [_fit(line, width) for line in lines[:height]]
