"""`llmgw top` and `llmgw nodes` against a real `llmgw up` (the stand-in engine in place of
llama-server): the console in tmux shows the node and its replica, follows traffic through the
gateway, and quits on q; the agent's metrics carry the node and its engine's load."""

import shutil
import sys

import httpx
import openai
import pytest

from tests.system import REPO, System, wait_ready
from tests.tmux_kit import Tmux, keep_screen
from workers.node_telemetry import parse_agent_metrics

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]


async def test_the_agents_metrics_and_llmgw_nodes(system: System, weights) -> None:
    system.cli("model", "add", "topmetrics", "--weights", str(weights), "--cpu-cores", "1")
    (replica,) = await wait_ready(system, "topmetrics", 1)
    url = f"http://127.0.0.1:{system.agent_metrics_port}/metrics"
    ledger = await system.ledger()
    assert ledger.nodes[system.node].inventory.metrics_url == url

    async def engine_read() -> bool:
        async with httpx.AsyncClient(trust_env=False) as http:
            page = (await http.get(url)).text
        figures = parse_agent_metrics(page, system.node)
        assert figures is not None
        return any(e.replica == replica and e.up for e in figures.engines)

    await system.until(engine_read, 30, "the agent reading its engine's metrics")
    listed = system.cli("nodes")
    assert "GPU NOW" in listed.stdout
    # This machine has no GPU: its agent answers with no GPU figures, and nothing is missing.
    assert "no GPU figures from" not in listed.stdout
    # A command prints what it is for: no log line per metrics read, unless asked.
    assert listed.stderr == ""
    status = system.cli("status")
    assert system.node in status.stdout
    assert status.stderr == ""
    assert "HTTP Request" in system.cli("nodes", "--verbose").stderr


async def test_top_shows_the_node_and_replica_follows_traffic_and_quits(
    system: System, weights
) -> None:
    system.cli("model", "add", "toptraffic", "--weights", str(weights), "--cpu-cores", "1")
    (replica,) = await wait_ready(system, "toptraffic", 1)
    command = (
        f"{sys.executable} -m workers.cli top --every 1 "
        f"--admin http://127.0.0.1:{system.admin_port}"
    )
    with Tmux.running(command, REPO, system.env()) as term:
        nodes = term.until(lambda s: system.node in s, "the node", within_s=30)
        assert "ready" in nodes
        assert "!" not in nodes.splitlines()[2]  # everything could be read
        keep_screen("live-nodes", nodes)
        term.keys("Tab")
        replicas = term.until(lambda s: replica in s, "the replica")
        (row,) = [line for line in replicas.splitlines() if line.startswith(replica)]
        assert row.split()[:4] == [replica, "toptraffic", "ready", system.node]
        keep_screen("live-replicas", replicas)

        client = openai.OpenAI(base_url=system.base_url, api_key=system.api_key)
        term.keys("Tab")
        term.until(lambda s: "[Traffic]" in s, "the traffic pane")
        for _ in range(5):
            client.chat.completions.create(
                model="toptraffic", messages=[{"role": "user", "content": "hi"}]
            )

        def traffic_shown(screen: str) -> bool:
            rows = [line.split() for line in screen.splitlines()]
            return any(r[:1] == ["toptraffic"] and r[1] not in ("-", "0.0") for r in rows)

        keep_screen("live-traffic", term.until(traffic_shown, "requests per second", within_s=20))
        term.keys("q")
        term.until_exited()
