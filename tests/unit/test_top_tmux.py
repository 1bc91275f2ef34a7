"""`llmgw top`'s console in a real terminal: tmux runs it on a stand-in source (a JSON file the
test rewrites), send-keys presses what an operator presses, capture-pane reads the screen."""

import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities.agent.gpu_telemetry import TelemetryReading, parse_telemetry_xml
from activities.agent.node_metrics import NodeReading
from activities.agent.node_metrics import render as render_metrics
from tests.machine_tools import MACHINES
from tests.tmux_kit import Tmux, keep_screen
from workers.node_telemetry import parse_agent_metrics
from workers.top.data import (
    GpuRow,
    KeyQuota,
    ModelCounters,
    NodeRow,
    ReplicaRow,
    TopData,
    WaitingRow,
    gpu_rows,
)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


def h100_gpus() -> list[GpuRow]:
    """The h100_sxm_x8 fixture's eight cards as an agent exports them and the CLI reads them."""
    xml = (MACHINES / "h100_sxm_x8" / "nvidia_smi_q_x.xml").read_text()
    page = render_metrics(
        "gpu-node-7", NodeReading(TelemetryReading(parse_telemetry_xml(xml), "nvml"))
    )
    figures = parse_agent_metrics(page.decode(), "gpu-node-7")
    assert figures is not None
    return gpu_rows(figures)


def data(taken_at: float, requests: float, gpu0_util: float, replica_state: str) -> TopData:
    gpus = h100_gpus()
    gpus[0].utilization_pct = gpu0_util
    return TopData(
        taken_at=taken_at,
        nodes=[
            NodeRow(name="gpu-node-7", state="ready", cpu_cores=96, gpus=gpus),
            NodeRow(name="cpu-node-1", state="ready", cordoned=True, cpu_cores=32),
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
            ),
            ReplicaRow(
                replica_id="smollm2-0",
                model="smollm2",
                state="ready",
                node="cpu-node-1",
                engine="llamacpp",
                running=0,
                waiting=0,
            ),
        ],
        models=[
            ModelCounters(
                model="chat",
                requests=requests,
                tokens=90 * requests,
                routed=requests,
                routed_to_cache=requests / 2,
                queue_refused={"queue_full": 3},
            ),
            ModelCounters(
                model="smollm2", requests=requests / 10, tokens=requests, routed=requests / 10
            ),
        ],
        keys=[
            KeyQuota(
                name="team-a",
                requests_today=1200,
                tokens_today=640000,
                budget_spent=640000,
                token_budget=1000000,
                rpm=600,
            ),
            KeyQuota(
                name="batch",
                requests_today=80,
                tokens_today=95000,
                budget_spent=2100000,
                token_budget=5000000,
                budget_period="month",
            ),
        ],
        in_flight=4,
        # The batch key floods the chat model; team-a's interactive request waits less.
        waiting=[
            WaitingRow(model="chat", key="team-a", priority="interactive", waiting=1, oldest_s=0.4),
            WaitingRow(model="chat", key="batch", priority="batch", waiting=12, oldest_s=8.2),
        ],
        replica_depths={"chat-0": 3, "smollm2-0": 4},
    )


def write(path: Path, top: TopData) -> None:
    # Replaced whole, so the console never reads half a file.
    partial = path.with_suffix(".partial")
    partial.write_text(top.model_dump_json())
    partial.replace(path)


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[tuple[Tmux, Path]]:
    source = tmp_path / "top.json"
    write(source, data(0.0, 0, 40, "loading"))
    command = f"{sys.executable} -m tests.top_standin {source} 0.5"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with Tmux.running(command, ROOT, env) as term:
        yield term, source


def test_top_shows_the_cluster_refreshes_in_place_and_quits_on_q(
    tmux: tuple[Tmux, Path],
) -> None:
    term, source = tmux
    first = term.until(lambda s: "gpu-node-7" in s, "the node")
    assert "NVIDIA H100 80GB HBM3" in first
    assert "1/2 replicas ready" in first.splitlines()[0]
    assert "40%" in first  # GPU 0

    # The next refresh shows what changed, in place: the same screen, new figures.
    write(source, data(2.0, 20, 97, "ready"))
    nodes = term.until(
        lambda s: "2/2 replicas ready" in s.splitlines()[0] and "97%" in s, "the refreshed figures"
    )
    assert "40%" not in nodes  # GPU 0's new figure replaced the old one
    keep_screen("nodes", nodes)

    term.keys("Tab")
    replicas = term.until(lambda s: "[Replicas]" in s, "the replicas pane")
    (chat,) = [line for line in replicas.splitlines() if line.startswith("chat-0")]
    assert chat.split()[:4] == ["chat-0", "chat", "ready", "gpu-node-7"]
    keep_screen("replicas", replicas)

    term.keys("Tab")
    # 20 requests in the 2 s between the two readings.
    traffic = term.until(lambda s: "[Traffic]" in s and "10.0" in s, "requests per second")
    time.sleep(1.5)  # three more readings of the same file: the rate stays
    assert "10.0" in term.drawn()
    assert "team-a" in traffic
    assert "13 waiting" in traffic.splitlines()[0]
    assert "Waiting in the gateway's fair queue:" in traffic
    assert ["chat", "batch", "batch", "12", "8.2s"] in [
        line.split() for line in traffic.splitlines()
    ]
    keep_screen("traffic", traffic)

    assert term.alive()
    term.keys("q")
    term.until_exited()
    # curses gave the terminal back: the console's screen is gone.
    assert "gpu-node-7" not in term.screen()
