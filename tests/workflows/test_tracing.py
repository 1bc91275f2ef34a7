"""Workflows traced through Temporal's own OpenTelemetry interceptor, as a collector receives
them over OTLP/HTTP: a replica's launch is one trace, from the workflow's start through
placement and the engine's start on its node to ready."""

from __future__ import annotations

import asyncio
from pathlib import Path

from store.fleet import open_fleet
from tests.otlp_receiver import ReceivedSpan, otlp_receiver
from tests.workflows.conftest import cluster_on, eventually, start_dev_server
from tests.workflows.test_replica import spec, start_replica, stop_and_wait
from workers.search_attributes import ensure_search_attributes
from workflows import otel
from workflows.client import connect
from workflows.contracts import ReplicaState


async def test_a_replicas_launch_is_one_trace_from_start_to_ready(
    server_config: Path, tmp_path: Path
) -> None:
    async with otlp_receiver() as receiver:
        assert otel.start("llmgw-control", receiver.endpoint)
        env = await start_dev_server()
        fleet = open_fleet(None, tmp_path)
        try:
            await fleet.init()
            # How every llmgw process connects: with tracing on, the interceptor comes along.
            client = await connect(env.client.service_client.config.target_host)
            await ensure_search_attributes(client)
            async with cluster_on(client, client, fleet, server_config) as cluster:
                await cluster.add_node()
                rid, handle = await start_replica(cluster, spec())

                async def ready() -> bool:
                    route = await cluster.route(rid)
                    return route is not None and route.state == ReplicaState.READY

                await eventually(ready)
                await stop_and_wait(handle)
        finally:
            await asyncio.to_thread(otel.shutdown)  # sends what is batched
            await fleet.close()
            await env.shutdown()
        spans = receiver.spans

    assert not otel.enabled()
    (started,) = [s for s in spans if s.name == "StartWorkflow:Replica"]
    in_trace = [s for s in spans if s.trace_id == started.trace_id]
    names = {s.name for s in in_trace}
    # Placement (a control activity), the engine's start and its readiness (the node agent's),
    # the route published: each scheduled by the workflow and run by a worker, in one trace.
    for step in ("ledger_place", "node_start_engine", "node_wait_ready", "ledger_set_route"):
        assert f"StartActivity:{step}" in names, sorted(names)
        assert f"RunActivity:{step}" in names, sorted(names)
    assert "RunWorkflow:Replica" in names
    by_id = {s.span_id: s for s in in_trace}

    def root(span: ReceivedSpan) -> ReceivedSpan:
        while span.parent_id in by_id:
            span = by_id[span.parent_id]
        return span

    assert {root(s).span_id for s in in_trace} == {started.span_id}
    assert {s.service for s in in_trace} == {"llmgw-control"}
