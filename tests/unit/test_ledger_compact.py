"""The ledger's compact state: placement decides the same on it, and it survives
continue-as-new as a payload well under Temporal's 2 MB limit."""

import random
import typing

from temporalio.contrib.pydantic import pydantic_data_converter

from bench.placement import PAYLOAD_LIMIT
from bench.simulated_fleet import replica_mix, route_for, simulated_node
from workflows.contracts import (
    GpuProcess,
    LedgerState,
    NodeInventory,
    NodeRecord,
    PlacementRefused,
)
from workflows.ledger import ClusterLedgerWorkflow
from workflows.ledger_compact import (
    PackedLedgerState,
    carried_state,
    compact_record,
    pack_state,
    unpack_state,
)
from workflows.placement import explain, place
from workflows.route_log import note_change


def fleet(nodes: int, replicas: int, compact: bool) -> LedgerState:
    """A simulated fleet with replicas placed on it, by the ledger's own rules."""
    rng = random.Random(7)
    state = LedgerState()
    for i in range(nodes):
        record = simulated_node(i, rng)
        state.nodes[record.inventory.name] = compact_record(record) if compact else record
    for replica in replica_mix(replicas, rng):
        decision = place(state, replica.request)
        if not isinstance(decision, PlacementRefused):
            state.allocations[decision.replica_id] = decision
            state.routes[decision.replica_id] = route_for(decision, replica.request)
    return state


def test_placement_decides_the_same_on_compact_records():
    full = fleet(40, 160, compact=False)
    compact = fleet(40, 160, compact=True)
    assert compact.allocations == full.allocations
    profiles = next(iter(replica_mix(10, random.Random(1)))).request.profiles
    assert explain(compact, profiles) == explain(full, profiles)


def test_compact_record_drops_what_changes_and_keeps_what_placement_reads():
    record = simulated_node(3, random.Random(1))
    record.inventory.gpus[0].processes = [GpuProcess(pid=42, name="python", used_memory_mb=900)]
    record.inventory.artifacts = ["sha256:0123456789abcdef"]  # placement prefers holders
    record.inventory.artifact_disk_free_mb = 41000  # and refuses nodes short of disk for them
    kept = compact_record(record)
    inv = kept.inventory
    assert all(not g.processes and g.memory_used_mb == 0 for g in inv.gpus)
    assert all(not p.counters for p in inv.network_ports)
    assert "avx2" in inv.cpu_flags  # what `llmgw nodes` shows
    assert len(inv.cpu_flags) < 10 < len(record.inventory.cpu_flags)
    assert [g.uuid for g in inv.gpus] == [g.uuid for g in record.inventory.gpus]
    assert [g.fabric for g in inv.gpus] == [g.fabric for g in record.inventory.gpus]
    assert inv.nvlink_matrix == record.inventory.nvlink_matrix
    assert inv.imex == record.inventory.imex
    assert inv.artifacts == record.inventory.artifacts
    assert inv.artifact_disk_free_mb == 41000
    assert (kept.state, kept.engines, kept.labels) == (record.state, record.engines, record.labels)
    assert len(kept.model_dump_json()) < len(record.model_dump_json()) * 0.75
    assert compact_record(kept) == kept


def test_packed_state_round_trips_and_compacts_nodes():
    state = fleet(20, 60, compact=False)
    state.version = 41
    packed = pack_state(state)
    assert unpack_state(packed) == state
    # A plain state (a run started before packing) has its nodes compacted when carried.
    carried = carried_state(state.model_copy(deep=True))
    assert carried.allocations == state.allocations
    assert carried.nodes == {n: compact_record(r) for n, r in state.nodes.items()}
    # A ledger packs only compacted nodes, and they come back as they went, with its route log.
    carried.version += 1
    note_change(carried, replica_id="m-0")
    again = carried_state(pack_state(carried))
    assert again == carried
    assert [c.replica_id for c in again.route_log] == ["m-0"]
    # A new ledger's route log is complete from its start; one carried from before the log
    # existed is complete only from the version it was carried at.
    assert carried_state(None) == LedgerState(route_log_floor=0)
    assert carried.route_log_floor == state.version


def test_the_ledger_takes_a_plain_or_a_packed_state_through_the_data_converter():
    """The run's input is a plain LedgerState from update-with-start (and from runs recorded
    before packing), a packed one from continue-as-new."""
    hint = typing.get_type_hints(ClusterLedgerWorkflow.run)["state"]
    state = LedgerState(version=5, nodes={"a": NodeRecord(inventory=NodeInventory(name="a"))})
    converter = pydantic_data_converter.payload_converter
    for value in (state, LedgerState(), pack_state(state), None):
        (back,) = converter.from_payloads(converter.to_payloads([value]), [hint])
        assert type(back) is type(value)
        assert back == value


def test_a_thousand_eight_gpu_nodes_pack_far_under_the_payload_limit():
    state = fleet(1000, 0, compact=False)
    assert len(state.model_dump_json()) > PAYLOAD_LIMIT  # what packing is for
    packed = pack_state(carried_state(state))
    assert isinstance(packed, PackedLedgerState)
    assert len(pydantic_data_converter.payload_converter.to_payloads([packed])[0].data) < (
        PAYLOAD_LIMIT / 4
    )
