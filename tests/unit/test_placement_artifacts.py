"""Placement of a model whose weights are a mirror artifact: among the nodes that can take the
replica, those already holding the artifact come first (the others would fetch it before the
engine starts); the usual spreading and bin-packing decide among equals. A node that would
fetch it needs the disk for it; one holding it needs none. `llmgw model why` says which node
holds the weights, which would fetch them and which lacks the disk. Pure."""

from tests.unit.placement_kit import (
    check_refusal,
    cpu_profile,
    gpu_profile,
    h100s,
    node,
    placed,
    refused,
    req,
)
from workflows.artifact_names import artifact_hint
from workflows.contracts import Allocation, LedgerState, ModelSpec, NodeRecord, PlacementRequest
from workflows.placement import explain, place
from workflows.placement.refusal import summarise_refusal

ARTIFACT = "sha256:" + "7e" * 32


def holding(record: NodeRecord) -> NodeRecord:
    inventory = record.inventory.model_copy(update={"artifacts": [artifact_hint(ARTIFACT)]})
    return record.model_copy(update={"inventory": inventory})


def for_artifact(request: PlacementRequest) -> PlacementRequest:
    return request.model_copy(update={"artifact": ARTIFACT})


def test_a_cpu_replica_goes_where_its_weights_are_even_against_spreading() -> None:
    # "a" runs a replica already, so spreading alone would pick "b" or "c".
    state = LedgerState(nodes={"a": holding(node("a", 8)), "b": node("b", 8), "c": node("c", 8)})
    placed(state, req("other-0", cpu_profile(2)))
    assert placed(state, req("plain-0", cpu_profile(2))).node == "b"
    assert placed(state, for_artifact(req("m-0", cpu_profile(2)))).node == "a"


def test_a_gpu_replica_prefers_the_holder_then_bin_packs() -> None:
    def cluster() -> LedgerState:
        return LedgerState(
            nodes={"a": holding(node("a", 64, h100s(8))), "b": node("b", 64, h100s(4))}
        )

    # Bin-packing alone takes the tighter "b"; the weights on "a" win.
    assert placed(cluster(), req("plain-0", gpu_profile(per_node=2))).node == "b"
    assert placed(cluster(), for_artifact(req("m-0", gpu_profile(per_node=2)))).node == "a"


def test_a_holder_that_cannot_take_it_is_passed_over() -> None:
    state = LedgerState(nodes={"a": holding(node("a", 2)), "b": node("b", 8)})
    assert placed(state, for_artifact(req("m-0", cpu_profile(4)))).node == "b"


# --- disk space for the weights ------------------------------------------------------------

GB = 10**9  # as the fetch and placement print sizes


def with_free_disk(record: NodeRecord, mb: int | None) -> NodeRecord:
    inventory = record.inventory.model_copy(update={"artifact_disk_free_mb": mb})
    return record.model_copy(update={"inventory": inventory})


def sized(request: PlacementRequest, size: int) -> PlacementRequest:
    return request.model_copy(update={"artifact": ARTIFACT, "artifact_size": size})


def test_a_node_without_the_disk_to_fetch_the_weights_is_refused_with_the_numbers() -> None:
    # 1 GB of weights needs 1 GB and the 0.5 GB margin: "a" has 0.4 GB, "b" 1.5 GB.
    state = LedgerState(
        nodes={"a": with_free_disk(node("a", 8), 410), "b": with_free_disk(node("b", 8), 1500)}
    )
    request = sized(req("m-0", cpu_profile(2)), GB)
    placed_on = place(state, request)
    assert isinstance(placed_on, Allocation)
    assert placed_on.node == "b"

    state.nodes["b"] = with_free_disk(node("b", 8), 1499)
    reasons = refused(state, request.model_copy(update={"replica_id": "m-1"}))
    check_refusal(state, request, reasons)
    assert reasons == {
        "a": "needs 1.5 GB of disk for the weights, 410 MB free",
        "b": "needs 1.5 GB of disk for the weights, 1.4 GB free",
    }


def test_the_margin_is_a_tenth_of_large_weights() -> None:
    # 40 GB of weights need 44 GB free.
    state = LedgerState(nodes={"a": with_free_disk(node("a", 8), 43_999)})
    reasons = refused(state, sized(req("m-0", cpu_profile(2)), 40 * GB))
    assert reasons == {"a": "needs 44 GB of disk for the weights, 43 GB free"}
    state.nodes["a"] = with_free_disk(node("a", 8), 44_000)
    assert placed(state, sized(req("m-0", cpu_profile(2)), 40 * GB)).node == "a"


def test_a_node_holding_the_weights_needs_no_disk_for_them() -> None:
    state = LedgerState(nodes={"a": with_free_disk(holding(node("a", 8)), 0)})
    assert placed(state, sized(req("m-0", cpu_profile(2)), 40 * GB)).node == "a"


def test_what_is_not_known_refuses_nothing() -> None:
    # An agent from before free space was reported, and a model defined without a size.
    old_agent = LedgerState(nodes={"a": with_free_disk(node("a", 8), None)})
    assert placed(old_agent, sized(req("m-0", cpu_profile(2)), 40 * GB)).node == "a"
    full = LedgerState(nodes={"a": with_free_disk(node("a", 8), 0)})
    assert placed(full, sized(req("m-0", cpu_profile(2)), 0)).node == "a"
    # And a model without an artifact has no weights to fetch.
    assert placed(full, req("plain-0", cpu_profile(2))).node == "a"


def test_a_refusal_for_disk_is_summarised_across_nodes_like_any_other() -> None:
    nodes = {f"n{i}": with_free_disk(node(f"n{i}", 8), 12_000 + 1000 * i) for i in range(3)}
    state = LedgerState(nodes=nodes)
    reasons = refused(state, sized(req("m-0", cpu_profile(2)), 40 * GB))
    assert summarise_refusal(reasons) == (
        "needs 44 GB of disk for the weights, 12-14 GB free: 3 nodes"
    )


def test_model_why_says_who_holds_the_weights_who_would_fetch_them_and_who_lacks_the_disk() -> None:
    state = LedgerState(
        nodes={
            "a": holding(node("a", 8)),
            "b": with_free_disk(node("b", 8), 100_000),
            "c": with_free_disk(node("c", 8), 410),
            "d": node("d", 1),
        }
    )
    spec = ModelSpec(
        name="m", weights="model.gguf", artifact=ARTIFACT, artifact_size=GB + GB // 5,
        profiles=[cpu_profile(2)],
    )  # fmt: skip
    assert explain(state, spec) == [
        "profile 1 (llamacpp cpu): would go to a",
        "  a: fits, holds the weights",
        "  b: fits, but would fetch the weights (1.2 GB): passed over for a node holding them",
        "  c: needs 1.7 GB of disk for the weights, 410 MB free",
        "  d: 1 of 1 CPU cores free, 2 wanted",
    ]
    # Without a holder that can take it, the chosen node fetches first.
    del state.nodes["a"]
    assert explain(state, spec)[:2] == [
        "profile 1 (llamacpp cpu): would go to b",
        "  b: fits, would fetch the weights first (1.2 GB)",
    ]
    assert not state.allocations
