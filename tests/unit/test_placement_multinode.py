"""A replica over several GPU nodes: one NVLink domain before InfiniBand or RoCE, a domain
without IMEX skipped, fabrics and domains never mixed. No Temporal here."""

from tests.unit.placement_kit import IB, ROCE, gpu_profile, h100s, node, placed, refused, req
from workflows.contracts import ImexInfo, LedgerState, Profile
from workflows.placement import CLUSTER


def two_by_four() -> Profile:
    return gpu_profile(per_node=4, nodes=2)


def test_a_two_node_replica_lands_in_the_nvlink_domain_before_infiniband() -> None:
    state = LedgerState(
        nodes={
            "a": node("a", 64, h100s(4), ports=[IB]),
            "b": node("b", 64, h100s(4), ports=[IB]),
            "c": node("c", 64, h100s(4), domain="rack-1", ports=[IB]),
            "d": node("d", 64, h100s(4), domain="rack-1", ports=[IB]),
        }
    )
    alloc = placed(state, req("m-0", two_by_four()))
    assert alloc.fabric == "nvlink"
    assert alloc.nvlink_domain == "rack-1/1"
    assert [(s.node, s.rank, s.gpus) for s in alloc.shards] == [
        ("c", 0, [0, 1, 2, 3]),
        ("d", 1, [0, 1, 2, 3]),
    ]
    assert alloc.node == "c"  # the leader is rank 0
    second = placed(state, req("m-1", two_by_four()))
    assert (second.fabric, [s.node for s in second.shards]) == ("infiniband", ["a", "b"])


def test_a_domain_with_imex_down_is_skipped_with_the_reason() -> None:
    down = ImexInfo(installed=True, running=False, detail="nvidia-imex.service: failed")
    nodes = {
        n: node(n, 64, h100s(4), domain="rack-1", imex=down, ports=[ROCE] if n in "cd" else [])
        for n in "abcd"
    }
    state = LedgerState(nodes=nodes)
    # c and d also have RoCE: the replica goes there, never half over NVLink.
    alloc = placed(state, req("m-0", two_by_four()))
    assert (alloc.fabric, [s.node for s in alloc.shards]) == ("roce", ["c", "d"])
    reasons = refused(state, req("m-1", two_by_four()))
    assert reasons["a"] == (
        "fits, but shares no fabric with enough others (NVLink domain rack-1/1: IMEX not "
        "running (nvidia-imex.service: failed))"
    )
    assert reasons["c"] == "0 of 4 h100-80g free, 4 wanted"
    assert reasons[CLUSTER] == (
        "no NVLink domain or fabric has 2 nodes with 4 free h100-80g each (2 of 4 nodes fit alone)"
    )


def test_fabrics_and_domains_are_never_mixed() -> None:
    state = LedgerState(
        nodes={
            "a": node("a", 64, h100s(4), domain="rack-1", ports=[IB]),
            "b": node("b", 64, h100s(4), domain="rack-2", ports=[ROCE]),
        }
    )
    reasons = refused(state, req("m-0", two_by_four()))
    assert reasons["a"].startswith("fits, but")
    assert CLUSTER in reasons
