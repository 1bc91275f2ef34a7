"""`llmgw top`'s keys as a small state machine: the operator's choices (pane, sort, scroll, the
selected row, an open prompt, the status line) and a key in; the new choices and what to do
out (quit, read now, or an action for workers/top/operate.py to run).

An action is never taken on one key: the key opens a prompt naming what will be done to what,
Enter does it, Esc cancels. Cordon and drain ask for a reason (optional, shown in `llmgw
nodes`), scale for a replica count, the Ollama import for Ollama's NAME[:TAG] and, after `as`,
the llmgw model's name if not the one made from Ollama's; a count or an Ollama name that cannot
be right is refused here, in the prompt, before anything is sent (the model's name is checked
by the import, in the web console's words).

Pure: no curses screen and no I/O (the key codes are curses' constants), so every path is
tested from key codes alone.
"""

from __future__ import annotations

import curses
from collections.abc import Sequence
from dataclasses import dataclass, replace

from workers.ollama.store import OllamaStoreError, parse_reference

PANES = ("Nodes", "Replicas", "Traffic", "Models", "Mirror")
SORTS: dict[str, tuple[str, ...]] = {
    "Nodes": ("name", "util", "memory", "temperature"),
    "Replicas": ("name", "model", "state", "load"),
    "Traffic": ("requests/s", "name"),
    "Models": ("name",),
    "Mirror": ("name",),
}
# The panes whose rows are picked with up/down for an action, and what a row is there.
SELECTABLE = {"Nodes": "node", "Models": "model"}
# Key -> (the pane it works in, the action).
ACTION_KEYS = {
    ord("c"): ("Nodes", "cordon"),
    ord("u"): ("Nodes", "uncordon"),
    ord("d"): ("Nodes", "drain"),
    ord("n"): ("Models", "scale"),
    ord("i"): ("Mirror", "import"),
}
NODE_ACTIONS = ("cordon", "uncordon", "drain")
HELP = "q quit  tab/left/right pane  s sort  up/down scroll  r refresh"
PANE_HELP = {
    "Nodes": "  c cordon  u uncordon  d drain",
    "Models": "  n scale",
    "Mirror": "  i import from Ollama",
}
PROMPT_HELP = "enter: do it  esc: cancel"

QUIT = "quit"
REFRESH = "refresh"
_TAB = 9
_ESC = 27
_ENTERS = (10, 13, curses.KEY_ENTER)
_BACKSPACES = (8, 127, curses.KEY_BACKSPACE)
_PAGE = 10
# A reason or a name longer than this is not typed by a person.
MAX_TEXT = 200


@dataclass(frozen=True)
class Action:
    """What the operator confirmed: `verb` (cordon, uncordon, drain, scale, import) on
    `target` (a node or model; "" for import) with `value` (the reason, the replica count,
    `NAME[:TAG]` or `NAME[:TAG] as MODEL` for the import: import_words splits it)."""

    verb: str
    target: str
    value: str = ""


@dataclass(frozen=True)
class Prompt:
    verb: str
    target: str
    text: str = ""
    error: str = ""  # why Enter did not do it

    @property
    def asks(self) -> bool:
        """Whether the prompt takes text (uncordon only asks for Enter)."""
        return self.verb != "uncordon"

    def question(self) -> str:
        if self.verb in ("cordon", "drain"):
            what = " (cordon, then move its replicas)" if self.verb == "drain" else ""
            return f"{self.verb} node {self.target}{what}; reason (optional): "
        if self.verb == "uncordon":
            return f"uncordon node {self.target}? "
        if self.verb == "scale":
            return f"scale model {self.target} to how many replicas: "
        return "import from Ollama as a model and into the mirror, NAME[:TAG] [as MODEL]: "

    def line(self) -> str:
        said = f"{self.question()}{self.text}_" if self.asks else self.question()
        return f"{said}   {PROMPT_HELP}"


@dataclass(frozen=True)
class UiState:
    pane: int = 0
    sorts: tuple[int, ...] = (0,) * len(PANES)
    scroll: int = 0
    selected: int = 0  # the row picked in a pane of SELECTABLE
    prompt: Prompt | None = None
    status: str = ""  # the last action's outcome, or why a key did nothing

    @property
    def pane_name(self) -> str:
        return PANES[self.pane]

    @property
    def sort_name(self) -> str:
        return SORTS[self.pane_name][self.sorts[self.pane]]

    @property
    def help(self) -> str:
        if self.prompt is not None:
            return self.prompt.line()
        return HELP + PANE_HELP.get(self.pane_name, "")

    @property
    def foot(self) -> list[str]:
        """The screen's last lines: the keys (or the open prompt), and above them why the
        prompt's text was refused, or else the last action's outcome."""
        if self.prompt is not None and self.prompt.error:
            return [f"! {self.prompt.error}", self.help]
        return [self.status, self.help] if self.status else [self.help]


KeyResult = tuple[UiState, str | Action | None]


def handle_key(ui: UiState, key: int, targets: Sequence[str] = ()) -> KeyResult:
    """The new choices after a key, and QUIT, REFRESH or an Action when the key asks for one.
    `targets`: the rows an action can pick in this pane, in the order they are shown."""
    if ui.prompt is not None:
        return _prompt_key(ui, ui.prompt, key)
    if key in (ord("q"), ord("Q")):
        return ui, QUIT
    if key in (ord("r"), ord("R")):
        return ui, REFRESH
    if key in (_TAB, curses.KEY_RIGHT):
        return _to_pane(ui, (ui.pane + 1) % len(PANES)), None
    if key in (curses.KEY_BTAB, curses.KEY_LEFT):
        return _to_pane(ui, (ui.pane - 1) % len(PANES)), None
    if key in (ord("s"), ord("S")):
        sorts = list(ui.sorts)
        sorts[ui.pane] = (sorts[ui.pane] + 1) % len(SORTS[ui.pane_name])
        return replace(ui, sorts=tuple(sorts), scroll=0), None
    moves = {
        curses.KEY_DOWN: 1,
        curses.KEY_UP: -1,
        curses.KEY_NPAGE: _PAGE,
        curses.KEY_PPAGE: -_PAGE,
    }
    if key in moves:
        if ui.pane_name in SELECTABLE:
            last = max(0, len(targets) - 1)
            return replace(ui, selected=min(last, max(0, ui.selected + moves[key]))), None
        return replace(ui, scroll=max(0, ui.scroll + moves[key])), None
    if key in ACTION_KEYS:
        return _open_prompt(ui, key, targets), None
    return ui, None


def _to_pane(ui: UiState, pane: int) -> UiState:
    return replace(ui, pane=pane, scroll=0, selected=0)


def _open_prompt(ui: UiState, key: int, targets: Sequence[str]) -> UiState:
    pane, verb = ACTION_KEYS[key]
    if ui.pane_name != pane:
        return replace(ui, status=f"{verb}: in the {pane} pane (tab to it)")
    target = ""
    if pane in SELECTABLE:
        if not targets:
            return replace(ui, status=f"{verb}: no {SELECTABLE[pane]} to {verb}")
        target = targets[min(ui.selected, len(targets) - 1)]
    return replace(ui, prompt=Prompt(verb, target), status="")


def _prompt_key(ui: UiState, prompt: Prompt, key: int) -> KeyResult:
    if key == _ESC:
        return replace(ui, prompt=None, status=f"{prompt.verb}: cancelled"), None
    if key in _ENTERS or (not prompt.asks and key in (ord("y"), ord("Y"))):
        value = prompt.text.strip()
        error = refusal(prompt.verb, value)
        if error:
            return replace(ui, prompt=replace(prompt, error=error)), None
        return replace(ui, prompt=None), Action(prompt.verb, prompt.target, value)
    if not prompt.asks:
        return ui, None
    if key in _BACKSPACES:
        return replace(ui, prompt=replace(prompt, text=prompt.text[:-1], error="")), None
    if 32 <= key < 127 and len(prompt.text) < MAX_TEXT:
        return replace(ui, prompt=replace(prompt, text=prompt.text + chr(key), error="")), None
    return ui, None


def refusal(verb: str, value: str) -> str:
    """Why `value` cannot be right for `verb`; "" when it may be (the cluster has the last
    word: a count beyond the model's maximum is refused by the model's workflow)."""
    if verb == "scale":
        if not value.isdigit():
            return f"the replica count is a whole number, 0 or more, not {value!r}"
        return ""
    if verb == "import":
        if not value:
            return "name the Ollama model, as `ollama list` shows it (NAME[:TAG])"
        try:
            reference, _ = import_words(value)
            parse_reference(reference)
        except (ValueError, OllamaStoreError) as err:
            return str(err)
    return ""


def import_words(value: str) -> tuple[str, str]:
    """The import prompt's text as (Ollama's NAME[:TAG], the llmgw model's name or "" for the
    one made from Ollama's): `NAME[:TAG]` or `NAME[:TAG] as MODEL`."""
    words = value.split()
    if len(words) == 1:
        return words[0], ""
    if len(words) == 3 and words[1] == "as":
        return words[0], words[2]
    raise ValueError(f"type NAME[:TAG], or NAME[:TAG] as MODEL, not {value!r}")
