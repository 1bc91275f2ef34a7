"""Placement on one GPU node, as an operator would recognise it: bin-packing, NVLink pairs,
MIG instances, broken GPUs, fp8 and the cores a GPU replica also takes. No Temporal here."""

from tests.unit.placement_kit import (
    MIG,
    gpu,
    gpu_profile,
    h100s,
    mig_instances,
    node,
    placed,
    refused,
    req,
)
from workflows.contracts import LedgerState


def test_bin_packing_leaves_a_whole_node_free_for_an_eight_gpu_replica() -> None:
    state = LedgerState(nodes={"a": node("a", 64, h100s(8)), "b": node("b", 64, h100s(8))})
    small = [placed(state, req(f"small-{i}", gpu_profile(per_node=2))) for i in range(4)]
    assert {a.node for a in small} == {"a"}  # all four on one node, not two on each
    assert sorted(i for a in small for i in a.shards[0].gpus) == list(range(8))
    big = placed(state, req("big", gpu_profile(per_node=8)))
    assert big.node == "b"
    assert big.shards[0].gpus == list(range(8))
    assert refused(state, req("more", gpu_profile(per_node=1))) == {
        "a": "0 of 8 h100-80g free, 1 wanted",
        "b": "0 of 8 h100-80g free, 1 wanted",
    }


def test_the_tightest_node_wins_even_when_it_is_not_first_by_name() -> None:
    state = LedgerState(nodes={"a": node("a", 64, h100s(8)), "b": node("b", 64, h100s(2))})
    assert placed(state, req("m-0", gpu_profile(per_node=2))).node == "b"


def test_gpus_on_one_node_are_nvlink_connected_where_the_matrix_says_so() -> None:
    # 0-2 and 1-3 are NVLink pairs; 0-1 only meet over the CPU interconnect.
    matrix = [
        ["X", "SYS", "NV12", "SYS"],
        ["SYS", "X", "SYS", "NV12"],
        ["NV12", "SYS", "X", "SYS"],
        ["SYS", "NV12", "SYS", "X"],
    ]
    record = node("a", 64, h100s(4))
    record.inventory.nvlink_matrix = matrix
    state = LedgerState(nodes={"a": record})
    assert placed(state, req("m-0", gpu_profile(per_node=2))).shards[0].gpus == [0, 2]
    assert placed(state, req("m-1", gpu_profile(per_node=2))).shards[0].gpus == [1, 3]


def test_mig_instances_are_handed_out_one_at_a_time() -> None:
    state = LedgerState(nodes={"a": node("a", 64, mig_instances(2, 2))})
    got = [placed(state, req(f"m-{i}", gpu_profile(MIG))).shards[0] for i in range(4)]
    assert [s.gpus for s in got] == [[1000], [1001], [1100], [1101]]
    assert [s.gpu_uuids for s in got] == [[f"GPU-{MIG}-{s.gpus[0]}"] for s in got]
    assert refused(state, req("m-4", gpu_profile(MIG))) == {"a": f"0 of 4 {MIG} free, 1 wanted"}


def test_a_mig_profile_wanting_more_than_one_instance_is_refused_here_too() -> None:
    state = LedgerState(nodes={"a": node("a", 64, mig_instances(2, 2))})
    reasons = refused(state, req("m-0", gpu_profile(MIG, per_node=2)))
    assert reasons["a"].startswith(f"{MIG} is a MIG instance: a replica runs on exactly one")


def test_a_gpu_with_ecc_errors_is_never_handed_out() -> None:
    bad = gpu(0, unusable="3 uncorrected ECC errors")
    state = LedgerState(nodes={"a": node("a", 64, [bad, gpu(1)])})
    assert placed(state, req("m-0", gpu_profile())).shards[0].gpus == [1]
    assert refused(state, req("m-1", gpu_profile())) == {
        "a": "0 of 2 h100-80g free, 1 wanted (GPU 0: 3 uncorrected ECC errors)"
    }


def test_fp8_on_an_a100_is_refused_with_the_reason() -> None:
    state = LedgerState(
        nodes={
            "a": node("a", 64, [gpu(i, "a100-80g") for i in range(8)]),
            "b": node("b", 64, [gpu(i, "l40s-48g") for i in range(8)]),
        }
    )
    reasons = refused(state, req("m-0", gpu_profile("a100-80g", 2, quantization="fp8")))
    assert reasons == {
        "a": "fp8 needs compute capability 8.9 or newer; a100-80g is 8.0",
        "b": "no a100-80g GPUs",
    }
    assert placed(state, req("m-1", gpu_profile("l40s-48g", 2, quantization="fp8"))).node == "b"


def test_cores_and_memory_are_reserved_for_gpu_replicas_too() -> None:
    state = LedgerState(nodes={"a": node("a", 6, h100s(8))})
    placed(state, req("m-0", gpu_profile()))  # 4 cores
    assert refused(state, req("m-1", gpu_profile())) == {"a": "2 of 6 CPU cores free, 4 wanted"}
