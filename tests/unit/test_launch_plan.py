"""A shard's ports besides its HTTP port come from placement; only allocations from before
placement handed them out derive them from the HTTP port, and a port missing from a newer one
fails the launch by name."""

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from temporalio.exceptions import ApplicationError

from activities.agent.launch_plan import LEGACY_PORT_OFFSETS, ShardPorts, port_free, shard_ports
from tests.unit.test_engine_ports import node, placed
from workflows.contracts import (
    Allocation,
    LedgerState,
    PlacementRequest,
    Profile,
    ShardAllocation,
)
from workflows.placement.ports import KV_PUB, KV_REPLAY, RENDEZVOUS

KV = Profile(engine="vllm", cpu_cores=1, memory_mb=512, kv_events=True)
TWO_NODES = Profile(
    engine="vllm", gpu_class="h100-80g", gpus_per_node=8, tensor_parallel=16, nodes=2
)


def shard(name: str, port: int, rank: int = 0, **extra: int) -> ShardAllocation:
    return ShardAllocation(node=name, address=name, port=port, rank=rank, extra_ports=extra)


def test_one_node_without_kv_events_uses_its_http_port_alone() -> None:
    one = shard("a", 18000)
    assert shard_ports(one, one, Profile(), 0) == ShardPorts({}, [18000])


def test_a_kv_events_leader_binds_the_ports_placement_handed_out() -> None:
    state = LedgerState(nodes={"a": node("a")})
    alloc = placed(state, PlacementRequest(replica_id="m-0", model="m", profiles=[KV]))
    (leader,) = alloc.shards
    ports = shard_ports(leader, leader, KV, 0)
    assert ports.by_name == leader.extra_ports
    assert ports.binds == sorted([leader.port, *leader.extra_ports.values()])


def test_a_worker_reads_the_leaders_rendezvous_point_and_binds_only_its_own_port() -> None:
    leader = shard("a", 18000, rendezvous=18001)
    worker = shard("b", 18000, rank=1)
    assert shard_ports(leader, leader, TWO_NODES, 0) == ShardPorts(
        {RENDEZVOUS: 18001}, [18000, 18001]
    )
    assert shard_ports(worker, leader, TWO_NODES, 1) == ShardPorts({RENDEZVOUS: 18001}, [18000])


def test_an_allocation_from_before_extra_ports_derives_them_as_it_did_then() -> None:
    # Carried by a replica workflow since then: its engine restarts on the same allocation.
    old = Allocation(replica_id="m-0", node="a", address="a", port=18000, cpu_cores=1, memory_mb=1)
    (leader,) = old.shards_or_leader()
    assert shard_ports(leader, leader, KV, 0).by_name == {
        KV_PUB: 18000 + LEGACY_PORT_OFFSETS[KV_PUB],
        KV_REPLAY: 18000 + LEGACY_PORT_OFFSETS[KV_REPLAY],
    }
    first, second = shard("a", 18000), shard("b", 18005, rank=1)
    assert shard_ports(second, first, TWO_NODES, 1).by_name == {
        RENDEZVOUS: 18000 + LEGACY_PORT_OFFSETS[RENDEZVOUS]
    }


def test_a_port_missing_from_a_placed_allocation_fails_the_launch_naming_it() -> None:
    leader = shard("a", 18000, rendezvous=18001)  # placed for a profile without KV events
    profile = TWO_NODES.model_copy(update={"kv_events": True})
    with pytest.raises(ApplicationError, match="no kv_pub port") as raised:
        shard_ports(leader, leader, profile, 0)
    assert raised.value.type == "PortMissing"
    assert raised.value.non_retryable


def test_each_port_is_checked_where_the_shard_binds_it() -> None:
    leader = shard("10.0.0.5", 18000, kv_pub=18001, kv_replay=18002, rendezvous=18003)
    ports = shard_ports(leader, leader, TWO_NODES.model_copy(update={"kv_events": True}), 0)
    # vLLM's KV ports are bound on loopback: a stranger there would stop the shard (or, on the
    # publisher's port, read its prompts' tokens).
    assert ports.host_of(18001, "10.0.0.5") == "127.0.0.1"
    assert ports.host_of(18002, "10.0.0.5") == "127.0.0.1"
    # Ray's head and torch's store listen on every address.
    assert ports.host_of(18003, "10.0.0.5") == "0.0.0.0"
    assert ports.host_of(18003, "fd00::5") == "::"
    assert ports.host_of(18000, "10.0.0.5") == "10.0.0.5"


def test_a_port_is_free_on_an_address_unless_held_there_or_on_every_address() -> None:
    with listening("127.0.0.1") as held:
        assert not port_free("127.0.0.1", held)
        assert not port_free("0.0.0.0", held)  # a rendezvous point would meet it
        # Another agent's engine on this machine, on an address of its own, is no stranger to
        # a shard on 127.0.0.2 (the test fleets run three nodes on one machine).
        assert port_free("127.0.0.2", held)
    with listening("0.0.0.0") as held:
        assert not port_free("127.0.0.2", held)
    assert port_free("127.0.0.1", held)


@contextmanager
def listening(host: str) -> Iterator[int]:
    with socket.socket() as stranger:
        stranger.bind((host, 0))
        stranger.listen()
        yield stranger.getsockname()[1]
