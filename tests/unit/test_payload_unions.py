"""Carried states and placement's answer decode the same whatever pydantic version the project
allows: through the project's own data converter (workflows/client.py) each comes back equal,
a union is told apart by its tag (or, for a payload from before the tag, by its shape), and no
payload contract holds a union that pydantic would have to guess between."""

import os
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError
from temporalio.converter import DataConverter

from workflows import contracts
from workflows.client import data_converter
from workflows.contracts import (
    Allocation,
    AutoscaleState,
    EngineExit,
    KvSource,
    ModelSpec,
    ModelState,
    NodeAdd,
    NodeInventory,
    NodeRecord,
    NodeRefresh,
    NodeState,
    NodeView,
    OnboardingProgress,
    PlacementRefusal,
    Profile,
    ReplaceReplicas,
    ReplicaCarried,
    ReplicaInput,
    ReplicaPhase,
    ReplicaState,
    ReplicaView,
    ShardAllocation,
    StopReplica,
)
from workflows.payload_codec import PayloadKeys
from workflows.replica.calls import PLACEMENT_ANSWER

AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
CONVERTERS = {
    "clear": data_converter(None),
    "sealed": data_converter(PayloadKeys((os.urandom(32),))),
}

ALLOCATION = Allocation(
    replica_id="m-0",
    workflow_id="replica:m:0",
    model="m",
    node="gpu-01",
    address="10.0.0.11",
    port=18000,
    cpu_cores=4,
    memory_mb=8192,
    shards=[ShardAllocation(node="gpu-01", address="10.0.0.11", port=18000, gpus=[0, 1])],
)
REFUSAL = PlacementRefusal(replica_id="m-1", summary="3 nodes: no h100-80g free")


async def round_trip(converter: DataConverter, value: Any, type_hint: Any) -> Any:
    [decoded] = await converter.decode(await converter.encode([value]), [type_hint])
    return decoded


@pytest.mark.parametrize("converter", CONVERTERS.values(), ids=CONVERTERS.keys())
@pytest.mark.parametrize("answer", [ALLOCATION, REFUSAL], ids=["allocation", "refusal"])
async def test_placements_answer_comes_back_as_what_it_was(
    converter: DataConverter, answer: BaseModel
) -> None:
    back = await round_trip(converter, answer, PLACEMENT_ANSWER)
    assert type(back) is type(answer)
    assert back == answer


@pytest.mark.parametrize("answer", [ALLOCATION, REFUSAL], ids=["allocation", "refusal"])
async def test_an_answer_from_before_the_tag_is_told_by_its_shape(answer: BaseModel) -> None:
    """A payload an older control worker wrote: no `kind`."""
    converter = data_converter(None)
    [payload] = await converter.encode([answer])
    old = answer.model_dump_json(exclude={"kind"}).encode()
    assert b'"kind"' in payload.data
    assert b'"kind"' not in old
    payload.data = old
    [back] = await converter.decode([payload], [PLACEMENT_ANSWER])
    assert type(back) is type(answer)
    assert back == answer


async def test_an_unknown_tag_is_refused_naming_the_tags() -> None:
    converter = data_converter(None)
    [payload] = await converter.encode([REFUSAL])
    payload.data = payload.data.replace(b'"refusal"', b'"offer"')
    with pytest.raises(ValidationError, match=r"'offer'.*does not match any of the expected tags"):
        await converter.decode([payload], [PLACEMENT_ANSWER])


def node_view() -> NodeView:
    inventory = NodeInventory(
        name="gpu-01", address="10.0.0.11", machine_id="abc", cpu_cores=64, memory_mb=512_000
    )
    record = NodeRecord(inventory=inventory, state=NodeState.READY, labels={"pool": "a"})
    return NodeView(record=record, boot_id="b1", identity="id", operator_labels={"pool": "a"})


def model_state() -> ModelState:
    spec = ModelSpec(name="m", weights="/w", profiles=[Profile(env={"NCCL_DEBUG": "INFO"})])
    return ModelState(
        spec=spec,
        next_index=3,
        indices=[0, 2],
        retiring={0: 2},
        fingerprints={0: "f0"},
        autoscale=AutoscaleState(queueing_since=AT, last_work=12.5),
        replacements=[ReplaceReplicas(replica_ids=["m-0"], reason="drain")],
        published_idle=False,
        look_at=AT,
    )


def replica_input() -> ReplicaInput:
    spec = ModelSpec(name="m", weights="/w", profiles=[Profile()])
    carried = ReplicaCarried(
        parent_workflow_id="model:m",
        phase=ReplicaPhase.RUNNING,
        allocation=ALLOCATION,
        view=ReplicaView(replica_id="m-0", model="m", state=ReplicaState.READY, node="gpu-01"),
        taken_ports={"gpu-01": [18001]},
        stop=StopReplica(reason="scaled down"),
        exit_report=EngineExit(replica_id="m-0", exit_code=1, reason="exit 1"),
        next_model=spec,
        kv=KvSource(feed="http://10.0.0.11:8003", block_size=16, hash_seed="0"),
    )
    return ReplicaInput(replica_id="m-0", model=spec, carried=carried)


CARRIED = {
    "node": (node_view(), NodeView),
    "model": (model_state(), ModelState),
    "replica": (replica_input(), ReplicaInput),
    "onboarding": (OnboardingProgress(nodes=[NodeAdd(name="gpu-02")], added=["gpu-01"]), None),
    "fleet refresh": (NodeRefresh(inventory=True, nodes=["gpu-01"]), None),
}


@pytest.mark.parametrize("converter", CONVERTERS.values(), ids=CONVERTERS.keys())
@pytest.mark.parametrize("name", CARRIED)
async def test_each_carried_state_comes_back_equal(converter: DataConverter, name: str) -> None:
    value, _ = CARRIED[name]
    back = await round_trip(converter, value, type(value))
    assert back == value
    assert back.model_dump() == value.model_dump()  # nested members kept their own types


def untagged_unions(schema: Any, seen: set[int] | None = None) -> list[str]:
    """Every union in a pydantic core schema that pydantic would settle by trying each member
    (`X | None` is a nullable schema, not a union; a tagged union names its member)."""
    seen = set() if seen is None else seen
    found: list[str] = []
    if isinstance(schema, dict):
        if id(schema) in seen:
            return found
        seen.add(id(schema))
        if schema.get("type") == "union":
            found.append(" | ".join(_member(choice) for choice in schema.get("choices", [])))
        for value in schema.values():
            found += untagged_unions(value, seen)
    elif isinstance(schema, (list, tuple)):
        for value in schema:
            found += untagged_unions(value, seen)
    return found


def _member(choice: Any) -> str:
    schema = choice[0] if isinstance(choice, tuple) else choice
    cls = schema.get("cls") if isinstance(schema, dict) else None
    return cls.__name__ if isinstance(cls, type) else str(schema.get("type", "?"))


def test_no_payload_contract_holds_a_union_pydantic_must_guess() -> None:
    models = [
        getattr(contracts, name)
        for name in contracts.__all__
        if isinstance(getattr(contracts, name), type)
        and issubclass(getattr(contracts, name), BaseModel)
    ]
    assert len(models) > 50
    guessed = {m.__name__: untagged_unions(m.__pydantic_core_schema__) for m in models}
    assert {name: unions for name, unions in guessed.items() if unions} == {}
    assert untagged_unions(TypeAdapter(PLACEMENT_ANSWER).core_schema) == []
    # The walk does find one: the union placement's answer was before its tag.
    assert untagged_unions(TypeAdapter(Allocation | PlacementRefusal).core_schema) == [
        "Allocation | PlacementRefusal"
    ]
