"""Placement of a model whose weights are a mirror artifact: among the nodes that can take the
replica, those already holding the artifact come first (the others would fetch it before the
engine starts); the usual spreading and bin-packing decide among equals. Pure."""

from tests.unit.placement_kit import cpu_profile, gpu_profile, h100s, node, placed, req
from workflows.artifact_names import artifact_hint
from workflows.contracts import LedgerState, NodeRecord, PlacementRequest

ARTIFACT = "sha256:" + "7e" * 32


def holding(record: NodeRecord) -> NodeRecord:
    inventory = record.inventory.model_copy(update={"artifacts": [artifact_hint(ARTIFACT)]})
    return record.model_copy(update={"inventory": inventory})


def for_artifact(request: PlacementRequest) -> PlacementRequest:
    return request.model_copy(update={"artifact": ARTIFACT})


def test_a_cpu_replica_goes_where_its_weights_are_even_against_spreading():
    # "a" runs a replica already, so spreading alone would pick "b" or "c".
    state = LedgerState(nodes={"a": holding(node("a", 8)), "b": node("b", 8), "c": node("c", 8)})
    placed(state, req("other-0", cpu_profile(2)))
    assert placed(state, req("plain-0", cpu_profile(2))).node == "b"
    assert placed(state, for_artifact(req("m-0", cpu_profile(2)))).node == "a"


def test_a_gpu_replica_prefers_the_holder_then_bin_packs():
    def cluster() -> LedgerState:
        return LedgerState(
            nodes={"a": holding(node("a", 64, h100s(8))), "b": node("b", 64, h100s(4))}
        )

    # Bin-packing alone takes the tighter "b"; the weights on "a" win.
    assert placed(cluster(), req("plain-0", gpu_profile(per_node=2))).node == "b"
    assert placed(cluster(), for_artifact(req("m-0", gpu_profile(per_node=2)))).node == "a"


def test_a_holder_that_cannot_take_it_is_passed_over():
    state = LedgerState(nodes={"a": holding(node("a", 2)), "b": node("b", 8)})
    assert placed(state, for_artifact(req("m-0", cpu_profile(4)))).node == "b"
