"""`llmgw top`: a live view of nodes, GPUs, replicas, load, requests per second, cache hits and
quota use in the terminal, redrawn in place.

The screen is curses from the standard library. Reading (workers/top/source.py) runs as a task
beside the key loop, so keys answer at once while a slow server is read; each refresh is
compared with the one before for the rates. Drawing is workers/top/render.py's pure render(),
keys are workers/top/keys.py's pure handle_key(). A confirmed action (cordon, drain, scale, an
Ollama import: workers/top/operate.py) also runs as a task, one at a time; its outcome goes to
the status line and a reading follows, so the screen shows what it changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import curses
import logging
import os
import time
from dataclasses import replace
from typing import Any

from workers.top.data import TopData, model_rates
from workers.top.keys import QUIT, REFRESH, Action, UiState, handle_key
from workers.top.operate import ActionRefused, NoOperator, Operator
from workers.top.render import Screen, render, selectable
from workers.top.source import TopSource

# How often keys are looked at and the screen redrawn when something changed.
TICK_S = 0.05


def _draw(window: Any, lines: list[str]) -> None:
    window.erase()
    height, width = window.getmaxyx()
    for y, line in enumerate(lines[:height]):
        # curses refuses a write into the bottom-right cell: the last column stays empty.
        window.addnstr(y, 0, line, max(0, width - 1))
    window.refresh()


def _outcome(task: asyncio.Task[str], action: Action) -> str:
    try:
        return task.result()
    except ActionRefused as err:
        return f"{action.verb} refused: {err}"
    except Exception as err:  # noqa: BLE001 - said on the status line; the console goes on
        return f"{action.verb} failed: {err or type(err).__name__}"


async def console(
    window: Any, source: TopSource, every_s: float, operator: Operator | None = None
) -> None:
    """Read, draw and answer keys until `q`."""
    window.nodelay(True)
    window.keypad(True)
    operator = operator or NoOperator()
    ui = UiState()
    acting: tuple[asyncio.Task[str], Action] | None = None
    # The latest progress line of the action running (written from the import's thread).
    progress = [""]

    def note(line: str) -> None:
        progress[0] = line

    current: TopData | None = None
    previous: TopData | None = None
    refreshed = ""
    problem = ""
    reading: asyncio.Task[TopData] | None = asyncio.create_task(source.read())
    next_read = time.monotonic() + every_s
    drawn: list[str] = []
    try:
        while True:
            if reading is not None and reading.done():
                try:
                    latest = reading.result()
                    # A source that had nothing newer (same time) keeps the pair the rates
                    # were worked out from.
                    if current is None or latest.taken_at > current.taken_at:
                        previous = current
                    current = latest
                    problem = ""
                except Exception as err:  # noqa: BLE001 - shown on screen; keep refreshing
                    problem = f"reading failed: {err or type(err).__name__}"
                refreshed = time.strftime("%H:%M:%S")
                reading = None
                next_read = time.monotonic() + every_s
            if reading is None and time.monotonic() >= next_read:
                reading = asyncio.create_task(source.read())
            if acting is not None and acting[0].done():
                ui = replace(ui, status=_outcome(*acting))
                acting = None
                if reading is None:
                    reading = asyncio.create_task(source.read())
            elif acting is not None and progress[0]:
                ui = replace(ui, status=progress[0])
            key = window.getch()
            while key != -1:
                ui, action = handle_key(ui, key, selectable(current, ui))
                if action == QUIT:
                    return
                if action == REFRESH and reading is None:
                    reading = asyncio.create_task(source.read())
                if isinstance(action, Action):
                    if acting is not None:
                        busy = f"{acting[1].verb} is still running: {action.verb} not sent"
                        ui = replace(ui, status=busy)
                    else:
                        said = f"{action.verb} {action.target or action.value}: running..."
                        ui = replace(ui, status=said)
                        progress[0] = ""
                        task = asyncio.create_task(operator.run(action, note))
                        acting = (task, action)
                key = window.getch()
            shown = current
            if shown is not None and problem:
                shown = shown.model_copy(update={"problems": [problem, *shown.problems]})
            screen = Screen(
                data=shown,
                rates=model_rates(current, previous) if current is not None else [],
                refreshed=refreshed,
                every_s=every_s,
                reading=reading is not None,
            )
            height, width = window.getmaxyx()
            lines = render(screen, ui, width, height)
            if lines != drawn:
                _draw(window, lines)
                drawn = lines
            await asyncio.sleep(TICK_S)
    finally:
        if reading is not None:
            reading.cancel()
        if acting is not None:
            acting[0].cancel()


async def run_console(source: TopSource, every_s: float, operator: Operator | None = None) -> None:
    """Take the terminal, run the console, and give the terminal back however it ends. Log
    records are dropped meanwhile: written to stderr they would land on the screen (what could
    not be read is on the screen's third line instead)."""
    logging.disable(logging.CRITICAL)
    # Esc cancels a prompt: wait 25 ms, not curses' second, to tell it from an arrow key.
    os.environ.setdefault("ESCDELAY", "25")
    window = curses.initscr()
    try:
        curses.noecho()
        curses.cbreak()
        with contextlib.suppress(curses.error):  # a terminal that cannot hide the cursor
            curses.curs_set(0)
        await console(window, source, every_s, operator)
    finally:
        window.keypad(False)
        curses.nocbreak()
        curses.echo()
        curses.endwin()
        logging.disable(logging.NOTSET)
