"""The autoscaler's one look at a model's load (activities/control/model_load.py) against real
HTTP servers on loopback: node agents' own metrics listeners (NodeMetricsService) and a
stand-in serving many agents' pages (rendered by the agent's own code), with the fleet tables
in a SQLite file."""

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from activities.agent.node_metrics import EngineLoadSample, NodeMetricsService, NodeReading
from activities.control.model_load import ModelLoadActivities
from store.fleet import FleetTables, open_fleet
from tests.agent_pages import ManyAgents, add_node, add_route, no_gpus, reading, sample
from workflows.contracts import ModelLoadRequest, ReplicaState

MODEL = "m"


@pytest.fixture
async def tables(tmp_path: Path) -> AsyncIterator[FleetTables]:
    fleet = open_fleet(None, tmp_path)
    await fleet.init()
    yield fleet
    await fleet.close()


async def agent(node: str, samples: list[EngineLoadSample]) -> NodeMetricsService:
    async def engines() -> list[EngineLoadSample]:
        return samples

    service = NodeMetricsService(node, engines, read_gpus=no_gpus, every_s=3600)
    await service.start("127.0.0.1", 0)
    await service.read_once()
    return service


async def test_a_look_sums_what_each_agents_page_says_for_the_models_routed_replicas(
    tables: FleetTables,
) -> None:
    n1 = await agent(
        "n1",
        [
            sample("m-0", 2, 3, 100.0),
            sample("m-1", 1, 0, 50.0),
            sample("other-0", 9, 9, 9.0),  # another model's engine on the same node
        ],
    )
    n2 = await agent("n2", [sample("m-2", 0, 0, 0.0, seen=False)])  # the agent could not read it
    try:
        await add_node(tables, "n1", f"http://127.0.0.1:{n1.port}/metrics")
        await add_node(tables, "n2", f"http://127.0.0.1:{n2.port}/metrics")
        # A URL that reaches another agent (a loopback address read from elsewhere): n1's page
        # names n1, so it says nothing about n4.
        await add_node(tables, "n4", f"http://127.0.0.1:{n1.port}/metrics")
        await add_node(tables, "n3", "")  # an agent started without --metrics-port
        await add_route(tables, "m-0", "n1")
        await add_route(tables, "m-1", "n1")
        await add_route(tables, "m-2", "n2")
        await add_route(tables, "m-3", "n3")
        await add_route(tables, "m-4", "n4")
        await add_route(tables, "m-5", "n1", state=ReplicaState.STARTING)  # not serving yet
        await add_route(tables, "other-0", "n1", model="other")

        look = ModelLoadActivities(tables)
        report = await look.model_load(ModelLoadRequest(model=MODEL, agents_to_ask=0))
        totals = report.totals
        assert (totals.seen, totals.running, totals.waiting, totals.work) == (2, 3, 3, 150.0)
        assert totals.unseen == 3  # m-2 (not read by its agent), m-3 (no page), m-4 (wrong page)
        assert (report.nodes, report.nodes_read) == (4, 2)
        assert report.ask_agents == []

        # Unread nodes handed back for their agents to be asked are in neither count.
        report = await look.model_load(ModelLoadRequest(model=MODEL, agents_to_ask=5))
        assert sorted((a.node, tuple(a.replica_ids)) for a in report.ask_agents) == [
            ("n3", ("m-3",)),
            ("n4", ("m-4",)),
        ]
        assert (report.totals.seen, report.totals.unseen) == (2, 1)
        report = await look.model_load(ModelLoadRequest(model=MODEL, agents_to_ask=1))
        assert len(report.ask_agents) == 1
        assert report.totals.unseen == 2
    finally:
        await n1.stop()
        await n2.stop()


async def test_hundreds_of_nodes_are_read_a_bounded_number_at_a_time_into_a_compact_answer(
    tables: FleetTables,
) -> None:
    nodes, per_node = 300, 10

    def page(node: str) -> NodeReading:
        index = int(node.removeprefix("n"))
        ids = [f"{MODEL}-{index * per_node + r}" for r in range(per_node)]
        return reading([sample(rid, 1, 2, 10.0) for rid in ids])

    async with ManyAgents(page, delay_s=0.02) as agents:
        for index in range(nodes):
            await add_node(tables, f"n{index}", agents.url(f"n{index}"))
            for r in range(per_node):
                await add_route(tables, f"{MODEL}-{index * per_node + r}", f"n{index}")
        look = ModelLoadActivities(tables, reads_at_once=8)
        report = await look.model_load(ModelLoadRequest(model=MODEL, agents_to_ask=8))
    replicas = nodes * per_node
    assert report.totals.seen == replicas
    assert report.totals.unseen == 0
    assert (report.totals.running, report.totals.waiting) == (replicas, 2 * replicas)
    assert report.totals.work == pytest.approx(10.0 * replicas)
    assert (report.nodes, report.nodes_read) == (nodes, nodes)
    assert agents.served == nodes
    assert 1 < agents.most_in_flight <= 8
    # The answer's size does not grow with the replicas or the nodes.
    assert len(report.model_dump_json()) < 300


async def test_stale_silent_and_broken_agents_leave_their_engines_unseen_within_the_budget(
    tables: FleetTables,
) -> None:
    pages: dict[str, NodeReading | None] = {
        "fresh": reading([sample("m-0", 1, 1, 1.0)]),
        "stale": reading([sample("m-1", 1, 1, 1.0)], age_s=120),  # its reading loop is stuck
        "silent": None,  # never answers
    }
    # Silent for a minute unless let go: a look that waited for it could not pass below.
    async with ManyAgents(lambda node: pages[node], silent_s=60.0) as agents:
        for node in pages:
            await add_node(tables, node, agents.url(node))
        await add_node(tables, "refused", "http://127.0.0.1:1/metrics")  # nothing listens
        await add_node(tables, "notfound", agents.url("fresh").replace("/n/", "/x/"))  # a 404
        for index, node in enumerate([*pages, "refused", "notfound"]):
            await add_route(tables, f"m-{index}", node)
        # Each read may take 30 s: only the look's budget can cut the silent agent short.
        look = ModelLoadActivities(tables, budget_s=3.0, timeout_s=30.0)
        report = await look.model_load(ModelLoadRequest(model=MODEL))
        # The look gave up on the silent agent at its budget: that read is still in flight.
        assert agents.in_flight == 1
    assert (report.totals.seen, report.totals.unseen) == (1, 4)
    assert report.nodes_read == 1


async def test_a_model_with_no_routes_reads_nothing(tables: FleetTables) -> None:
    report = await ModelLoadActivities(tables).model_load(ModelLoadRequest(model=MODEL))
    assert report.totals.seen == report.totals.unseen == report.nodes == 0
