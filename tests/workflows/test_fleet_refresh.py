"""A fleet refresh at fleet size: signals go out in batches and the run continues as new with
the nodes still to be told, so its history stays bounded however many nodes there are."""

import pytest

import workflows.history_budget as history_budget
from tests.workflows.conftest import Cluster, eventually, record_history, unique
from tests.workflows.test_node import register, registration, wait_for_node
from tests.workflows.test_replica import run_histories
from workflows.contracts import EngineState, NodeRefresh, NodeState
from workflows.fleet import SIGNAL_BATCH, FleetRefreshWorkflow


async def test_a_refresh_of_many_nodes_continues_as_new_and_tells_every_one(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    await register(cluster, cluster.node, registration(cluster.node))
    await wait_for_node(cluster, NodeState.READY, EngineState.INSTALLED)
    monkeypatch.setattr(history_budget, "FORCE_EVERY_EVENTS", 20)
    # Names without a workflow stand in for most of a large fleet: they are skipped, not fatal.
    names = [unique("gone") for _ in range(3 * SIGNAL_BATCH)] + [cluster.node]
    run = await cluster.start(
        FleetRefreshWorkflow.run,
        NodeRefresh(inventory=True, nodes=names),
        id=unique("fleet-refresh"),
    )
    told = await run.result()
    assert told.names == [cluster.node]
    histories = await run_histories(cluster.client, run.id)
    assert len(histories) >= 3, "never continued as new"
    assert max(len(h) for h in histories) < 2 * SIGNAL_BATCH + 40
    await record_history(run, "FleetRefreshContinued")

    async def looked_again() -> bool:
        return cluster.agent.discoveries == 1

    await eventually(looked_again)
