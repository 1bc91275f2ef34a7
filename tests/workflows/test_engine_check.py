"""`llmgw engine check NODE ENGINE` against a node workflow and its (stand-in) agent: the
node re-verifies on demand and the command answers with what the agent found."""

import pytest

from tests.workflows.conftest import Cluster
from tests.workflows.test_node import register, registration, wait_for_node
from workers.commands.engine import check_engine, status_line
from workflows.contracts import EngineState, NodeState


async def test_a_check_reports_a_broken_engine_then_a_mended_one(cluster: Cluster) -> None:
    await register(cluster, cluster.node, registration(cluster.node))
    await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)
    before = cluster.agent.verifications

    cluster.agent.broken["llamacpp"] = "ldd: libgomp.so.1 => not found"
    status = await check_engine(cluster.client, cluster.node, "llamacpp", within_s=30)
    assert status.state == EngineState.FAILED
    assert status.detail == "ldd: libgomp.so.1 => not found"
    assert cluster.agent.verifications == before + 1
    assert status_line(cluster.node, status) == (
        f"llamacpp 11434.0.0 on {cluster.node}: failed (last seen running "
        "2026-11-30T12:00:00+00:00): ldd: libgomp.so.1 => not found"
    )
    # The node took it: placement reads the same record.
    assert (await wait_for_node(cluster, NodeState.READY, EngineState.FAILED)).engines

    del cluster.agent.broken["llamacpp"]
    status = await check_engine(cluster.client, cluster.node, "llamacpp", within_s=30)
    assert status.state == EngineState.INSTALLED


async def test_a_check_of_what_cannot_be_checked_says_why(cluster: Cluster) -> None:
    with pytest.raises(SystemExit, match="no node 'nowhere'"):
        await check_engine(cluster.client, "nowhere", "llamacpp")
    await register(cluster, cluster.node, registration(cluster.node))
    await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)
    with pytest.raises(SystemExit, match=r"has no engine 'vllm' \(it has: llamacpp\)"):
        await check_engine(cluster.client, cluster.node, "vllm")
