"""Ports come from the node's range, and a port held by a program outside llmgw is skipped, not
retried: the agent refuses the launch with the ports in its details, and placement asked again
with them excluded hands out others. A shard's other ports (rendezvous, KV events) come from the
range too."""

import socket
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.agent.launch_plan import port_free
from activities.agent.node_agent import NodeAgentActivities
from tests.unit.test_node_agent import (
    STANDIN,
    make_config,
    venv_python_first,  # noqa: F401 - autouse, for the stand-in
)
from workflows.contracts import (
    Allocation,
    EngineState,
    EngineStatus,
    LaunchRequest,
    LedgerState,
    ModelSpec,
    NodeInventory,
    NodeRecord,
    NodeState,
    PlacementRefused,
    PlacementRequest,
    PortsInUse,
    Profile,
)
from workflows.placement import node_usage, place


def node(name: str, port_min: int = 18000, port_max: int = 18999) -> NodeRecord:
    return NodeRecord(
        inventory=NodeInventory(name=name, address="127.0.0.1", cpu_cores=64, memory_mb=65536),
        state=NodeState.READY,
        engines={
            e: EngineStatus(engine=e, version="1", state=EngineState.INSTALLED)
            for e in ("llamacpp", "vllm")
        },
        port_min=port_min,
        port_max=port_max,
    )


CPU = Profile(engine="llamacpp", cpu_cores=1, memory_mb=512)


def placed(state: LedgerState, req: PlacementRequest) -> Allocation:
    decision = place(state, req)
    assert isinstance(decision, Allocation), decision
    state.allocations[req.replica_id] = decision
    return decision


def test_a_port_held_by_another_program_is_skipped_when_placing_again() -> None:
    state = LedgerState(nodes={"a": node("a")})
    first = placed(state, PlacementRequest(replica_id="m-0", model="m", profiles=[CPU]))
    assert first.port == 18000
    # The agent refused: 18000 is someone else's. The replica releases and asks again.
    del state.allocations["m-0"]
    again = placed(
        state,
        PlacementRequest(replica_id="m-0", model="m", profiles=[CPU], exclude_ports={"a": [18000]}),
    )
    assert again.port == 18001
    # With its other port taken too, node a has none left: the next replica goes to b.
    state.nodes["b"] = node("b")
    state.nodes["a"] = state.nodes["a"].model_copy(update={"port_max": 18001})
    elsewhere = place(
        state,
        PlacementRequest(replica_id="m-1", model="m", profiles=[CPU], exclude_ports={"a": [18000]}),
    )
    assert isinstance(elsewhere, Allocation)
    assert elsewhere.node == "b"


def test_a_node_whose_only_free_ports_are_held_says_so() -> None:
    state = LedgerState(nodes={"a": node("a", 18000, 18000)})
    refused = place(
        state,
        PlacementRequest(replica_id="m-0", model="m", profiles=[CPU], exclude_ports={"a": [18000]}),
    )
    assert isinstance(refused, PlacementRefused)
    assert refused.reasons == {"a": "no free engine port (1 held by other programs)"}


def test_a_kv_events_leader_gets_its_other_ports_from_the_range_each_once() -> None:
    kv = Profile(engine="vllm", cpu_cores=1, memory_mb=512, kv_events=True)
    state = LedgerState(nodes={"a": node("a")})
    one = placed(state, PlacementRequest(replica_id="m-0", model="m", profiles=[kv]))
    two = placed(state, PlacementRequest(replica_id="m-1", model="m", profiles=[kv]))
    ports = [p for a in (one, two) for s in a.shards for p in (s.port, *s.extra_ports.values())]
    assert sorted(one.shards[0].extra_ports) == ["kv_pub", "kv_replay"]
    assert len(set(ports)) == len(ports) == 6
    assert all(18000 <= p <= 18999 for p in ports)
    assert node_usage(state, "a").ports == set(ports)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[NodeAgentActivities]:
    config = replace(
        make_config(tmp_path),
        engine_paths={"llamacpp": str(STANDIN), "vllm": str(STANDIN)},
        nvidia=False,
    )
    acts = NodeAgentActivities(config)
    yield acts
    acts.stop_all_engines()


async def test_the_agent_refuses_a_held_kv_port_naming_it_for_placement(
    agent: NodeAgentActivities, tmp_path: Path
) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    kv = Profile(engine="vllm", engine_version="1", cpu_cores=1, memory_mb=512, kv_events=True)
    state = LedgerState(nodes={"node-a": node("node-a", 18000, 18999)})
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        held = stranger.getsockname()[1]
        # Placement handed out the stranger's port as this shard's KV publisher port.
        state.nodes["node-a"] = node("node-a", held - 1, held + 1)
        alloc = placed(state, PlacementRequest(replica_id="m-0", model="m", profiles=[kv]))
        assert alloc.shards[0].extra_ports["kv_pub"] == held
        req = LaunchRequest(
            replica_id="m-0",
            workflow_id="replica:m:0",
            model=ModelSpec(name="m", weights=str(model_dir), profiles=[kv]),
            allocation=alloc,
        )
        with pytest.raises(ApplicationError) as raised:
            await ActivityEnvironment().run(agent.start_engine, req)
    err = raised.value
    assert err.type == "PortInUse"
    assert err.non_retryable
    refused = PortsInUse.model_validate(err.details[0])
    assert refused.node == "node-a"
    assert held in refused.ports
    # Another program on this machine may hold the shard's other port as well; only ports the
    # allocation handed out and that really are taken may be named.
    handed_out = {alloc.shards[0].port, *alloc.shards[0].extra_ports.values()}
    assert set(refused.ports) <= handed_out
    assert all(port == held or not port_free("127.0.0.1", port) for port in refused.ports)
    assert agent.supervisor.shards() == []
