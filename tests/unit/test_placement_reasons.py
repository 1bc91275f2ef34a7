"""What placement says: why each node refuses, per profile; the fallback profile; the
allocations it counts; and `llmgw model why`'s explanation. No Temporal here."""

from tests.unit.placement_kit import (
    cpu_profile,
    gpu,
    gpu_profile,
    h100s,
    installed,
    node,
    placed,
    refused,
    req,
)
from workflows.contracts import (
    Allocation,
    EngineState,
    EngineStatus,
    LedgerState,
    ModelSpec,
    NodeState,
)
from workflows.placement import CLUSTER, NodeUsage, explain, node_usage, why_not


def test_an_empty_cluster_says_no_node_has_registered() -> None:
    assert refused(LedgerState(), req("m-0", cpu_profile())) == {
        CLUSTER: "no nodes have registered"
    }


def test_refusal_reasons_name_what_is_missing() -> None:
    installing = node("b", 8)
    installing.engines["llamacpp"] = EngineStatus(
        engine="llamacpp", version="1", state=EngineState.INSTALLING, detail="building 45%"
    )
    no_vllm = node("f", 8)
    no_vllm.engines["vllm"] = EngineStatus(
        engine="vllm", version="0.32.0", state=EngineState.UNAVAILABLE, detail="needs an NVIDIA GPU"
    )
    state = LedgerState(
        nodes={
            "a": node("a", 1),
            "b": installing,
            "c": node("c", 8, cordoned=True, note="disk swap"),
            "d": node("d", 8, state=NodeState.LOST),
            "e": node("e", 8),
        }
    )
    request = req("m-0", cpu_profile(2, engine_version="1"), exclude=["e"])
    assert refused(state, request) == {
        "a": "1 of 1 CPU cores free, 2 wanted",
        "b": "llamacpp installing: building 45%",
        "c": "node is cordoned (disk swap)",
        "d": "node is lost",
        "e": "excluded: moving away from this node",
    }
    gpus = LedgerState(
        nodes={
            "f": no_vllm,
            "g": node("g", 8, h100s(8)).model_copy(
                update={"engines": installed("vllm", version="0.31.0")}
            ),
            "h": node("h", 8, [gpu(i, "a100-80g") for i in range(8)]),
        }
    )
    assert refused(gpus, req("m-1", gpu_profile(per_node=4, engine_version="0.32.0"))) == {
        "f": "vllm unavailable: needs an NVIDIA GPU",
        "g": "vllm 0.31.0 installed, 0.32.0 wanted",
        "h": "vllm 1 installed, 0.32.0 wanted",
    }
    h = gpus.nodes["h"]
    assert why_not(h, gpu_profile(per_node=4), NodeUsage()) == "no h100-80g GPUs"


def test_reasons_say_which_profile_they_are_for() -> None:
    state = LedgerState(nodes={"a": node("a", 2, h100s(2))})
    reasons = refused(state, req("m-0", gpu_profile(per_node=4), cpu_profile(4)))
    assert reasons == {
        "a": "profile 1 (vllm h100-80g x4): 2 of 2 h100-80g free, 4 wanted; "
        "profile 2 (llamacpp cpu): 2 of 2 CPU cores free, 4 wanted"
    }


def test_the_second_profile_is_used_when_the_first_fits_nowhere() -> None:
    state = LedgerState(nodes={"a": node("a", 64, h100s(2)), "b": node("b", 64)})
    alloc = placed(state, req("m-0", gpu_profile(per_node=4), gpu_profile(per_node=2)))
    assert (alloc.profile_index, alloc.node, alloc.shards[0].gpus) == (1, "a", [0, 1])
    # The first profile still wins when it fits.
    assert placed(state, req("m-1", cpu_profile(), gpu_profile())).profile_index == 0


def test_an_allocation_from_before_shards_still_counts() -> None:
    state = LedgerState(nodes={"a": node("a", 2, port_max=18000)})
    state.allocations["old"] = Allocation(
        replica_id="old", node="a", address="x", port=18000, cpu_cores=1, memory_mb=64
    )
    usage = node_usage(state, "a")
    assert (usage.cpu_cores, usage.memory_mb, usage.ports, usage.shards) == (1, 64, {18000}, 1)
    assert refused(state, req("m-0", cpu_profile())) == {"a": "no free engine port"}


def test_explain_reserves_nothing_and_says_why_for_every_node() -> None:
    state = LedgerState(nodes={"a": node("a", 64, h100s(2)), "b": node("b", 2)})
    spec = ModelSpec(name="m", weights="w", profiles=[gpu_profile(per_node=4), cpu_profile(2)])
    assert explain(state, spec) == [
        "profile 1 (vllm h100-80g x4): fits nowhere",
        "  a: 2 of 2 h100-80g free, 4 wanted",
        "  b: no h100-80g GPUs",
        "profile 2 (llamacpp cpu): would go to a",
        "  a: fits",
        "  b: fits",
    ]
    assert not state.allocations
    assert explain(LedgerState(), spec) == ["no nodes have registered"]
