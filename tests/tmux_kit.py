"""A console run in a real terminal for tests: tmux on a server of its own, send-keys to press
what an operator presses, capture-pane to read the screen."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def keep_screen(name: str, screen: str) -> None:
    """Keep a screen the test saw, for the docs (docs/top.md), in the directory
    LLMGW_TOP_SCREENS names; unset: not kept."""
    where = os.environ.get("LLMGW_TOP_SCREENS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        (Path(where) / f"{name}.txt").write_text(screen)


# How long a screen must stay the same to count as drawn whole.
SETTLE_S = 0.15


class Tmux:
    def __init__(self) -> None:
        # A server of its own: nothing of the operator's tmux is touched.
        self.socket = f"llmgw-top-{uuid.uuid4().hex[:8]}"
        self.session = "top"

    def run(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=True
        )
        return done.stdout

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", self.session)

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", self.session, *keys)

    def alive(self) -> bool:
        done = subprocess.run(
            ["tmux", "-L", self.socket, "list-panes", "-t", self.session, "-F", "#{pane_dead}"],
            capture_output=True,
            text=True,
            check=False,
        )
        return done.returncode == 0 and done.stdout.strip() == "0"

    def until(self, check: Callable[[str], bool], what: str, within_s: float = 15.0) -> str:
        """The screen once `check` holds and it is drawn whole: the same on a second look a
        moment later. A capture can fall in the middle of a redraw, the part of the screen
        `check` looks at new and the rest not yet drawn (on a loaded machine, often)."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            screen = self.screen()
            if check(screen):
                time.sleep(SETTLE_S)
                if self.screen() == screen:
                    return screen
                continue
            time.sleep(0.1)
        raise AssertionError(f"{what} not on screen within {within_s}s:\n{self.screen()}")

    def drawn(self) -> str:
        """The screen as drawn whole (see `until`)."""
        return self.until(lambda _: True, "a whole screen")

    def until_exited(self, within_s: float = 10.0) -> None:
        deadline = time.monotonic() + within_s
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not self.alive(), f"still running after {within_s}s:\n{self.screen()}"

    @classmethod
    @contextmanager
    def running(
        cls, command: str, cwd: Path, env: dict[str, str], width: int = 120, height: int = 30
    ) -> Iterator[Tmux]:
        """`command` in a detached session of this size; the server is killed afterwards."""
        term = cls()
        # The pane stays after the command ends, so a test can see that it ended (and how):
        # set before the session starts, so even a command that fails at once leaves it.
        subprocess.run(
            [
                *("tmux", "-L", term.socket, "-f", "/dev/null", "start-server", ";"),
                *("set-option", "-g", "remain-on-exit", "on", ";"),
                *("new-session", "-d", "-s", term.session, "-x", str(width), "-y", str(height)),
                *("-c", str(cwd), command),
            ],
            check=True,
            # Without COLUMNS and LINES: curses takes them over the terminal's own size, and
            # pytest-xdist sets them (80x24) in its workers.
            env={k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}
            | {"TERM": "xterm-256color"},
        )
        try:
            yield term
        finally:
            subprocess.run(["tmux", "-L", term.socket, "kill-server"], check=False)
