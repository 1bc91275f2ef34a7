"""`llmgw top`'s console in a real terminal: tmux runs it on a stand-in source (a JSON file the
test rewrites), send-keys presses what an operator presses, capture-pane reads the screen."""

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from workers.top_data import GpuRow, ModelCounters, NodeRow, ReplicaRow, TopData

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
GIB = 1024**3


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
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            screen = self.screen()
            if check(screen):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{what} not on screen within {within_s}s:\n{self.screen()}")


def data(taken_at: float, requests: float, util: float, replica_state: str) -> TopData:
    return TopData(
        taken_at=taken_at,
        nodes=[
            NodeRow(
                name="gpu-node-7",
                state="ready",
                gpus=[
                    GpuRow(
                        index=0,
                        name="NVIDIA H100 80GB HBM3",
                        utilization_pct=util,
                        memory_used=40 * GIB,
                        memory_total=80 * GIB,
                        temperature_c=61,
                        power_w=350,
                        power_limit_w=700,
                    )
                ],
            )
        ],
        replicas=[
            ReplicaRow(
                replica_id="chat-0",
                model="chat",
                state=replica_state,
                node="gpu-node-7",
                engine="vllm",
                running=3,
                waiting=1,
            )
        ],
        models=[ModelCounters(model="chat", requests=requests, routed=requests)],
    )


def write(path: Path, top: TopData) -> None:
    # Replaced whole, so the console never reads half a file.
    partial = path.with_suffix(".partial")
    partial.write_text(top.model_dump_json())
    partial.replace(path)


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[tuple[Tmux, Path]]:
    source = tmp_path / "top.json"
    write(source, data(0.0, 0, 12, "loading"))
    term = Tmux()
    command = f"{sys.executable} -m tests.top_standin {source} 0.5"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm-256color"}
    subprocess.run(
        [
            *("tmux", "-L", term.socket, "-f", "/dev/null", "new-session", "-d"),
            *("-s", term.session, "-x", "120", "-y", "30", "-c", str(ROOT), command),
        ],
        check=True,
        env=env,
    )
    term.run("set-option", "-t", term.session, "remain-on-exit", "on")
    try:
        yield term, source
    finally:
        subprocess.run(["tmux", "-L", term.socket, "kill-server"], check=False)


def test_top_shows_the_cluster_refreshes_in_place_and_quits_on_q(
    tmux: tuple[Tmux, Path],
) -> None:
    term, source = tmux
    first = term.until(lambda s: "gpu-node-7" in s, "the node")
    assert "NVIDIA H100 80GB HBM3" in first
    assert "12%" in first
    assert "40/80" in first

    # The next refresh shows what changed, in place: the same screen, new figures.
    write(source, data(2.0, 20, 97, "ready"))
    term.until(lambda s: "97%" in s and "12%" not in s, "the refreshed utilisation")

    term.keys("Tab")
    replicas = term.until(lambda s: "[Replicas]" in s, "the replicas pane")
    assert "chat-0" in replicas
    assert "ready" in replicas

    term.keys("Tab")
    # 20 requests in the 2 s between the two readings.
    term.until(lambda s: "[Traffic]" in s and "10.0" in s, "requests per second")
    time.sleep(1.5)  # three more readings of the same file: the rate stays
    assert "10.0" in term.screen()

    assert term.alive()
    term.keys("q")
    deadline = time.monotonic() + 10
    while term.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not term.alive(), term.screen()
    # curses gave the terminal back: the console's screen is gone.
    assert "gpu-node-7" not in term.screen()
