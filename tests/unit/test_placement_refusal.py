"""A placement refusal as the ledger answers it: grouped, counted, small at any fleet size."""

from workflows.placement import CLUSTER
from workflows.placement.refusal import MAX_SUMMARY, summarise_refusal


def test_reasons_that_differ_only_in_numbers_are_one_group_with_the_range() -> None:
    reasons = {f"gpu-{i:04}": f"{i % 3} of 8 h100-80g free, 4 wanted" for i in range(812)}
    reasons |= {f"cordoned-{i}": "node is cordoned (disk swap)" for i in range(3)}
    summary = summarise_refusal(reasons)
    assert summary == (
        "0-2 of 8 h100-80g free, 4 wanted: 812 nodes; node is cordoned (disk swap): 3 nodes"
    )


def test_a_reason_only_one_node_gives_names_it_and_the_cluster_reason_comes_first() -> None:
    reasons = {
        "a1": "node is lost",
        "a2": "node is lost",
        "b1": "llamacpp installing: building llama-server 45%",
        CLUSTER: "no NVLink domain or fabric has 2 nodes with 4 free h100-80g each",
    }
    assert summarise_refusal(reasons) == (
        f"{CLUSTER}: no NVLink domain or fabric has 2 nodes with 4 free h100-80g each; "
        "node is lost: 2 nodes; b1: llamacpp installing: building llama-server 45%"
    )


def test_numbers_inside_names_are_not_ranges() -> None:
    reasons = {
        "n1": "no a100-80g-mig-3g.40gb GPUs",
        "n2": "no a100-80g-mig-1g.10gb GPUs",
    }
    # Two different classes: two reasons, not "no a100-1-80g...".
    summary = summarise_refusal(reasons)
    assert "n1: no a100-80g-mig-3g.40gb GPUs" in summary
    assert "n2: no a100-80g-mig-1g.10gb GPUs" in summary


def test_a_thousand_different_reasons_stay_under_the_cap_and_say_how_many_were_left_out() -> None:
    reasons = {f"node-{i:04}": f"llamacpp failed: error code E{i:04}x" for i in range(1000)}
    summary = summarise_refusal(reasons)
    assert len(summary) <= MAX_SUMMARY
    assert summary.startswith("node-0000: llamacpp failed: error code E0000x; ")
    assert summary.endswith("more reasons (`llmgw model why` lists every node)")
    kept = summary.count("llamacpp failed")
    assert f"and {1000 - kept} more reasons" in summary


def test_one_huge_reason_is_cut_and_lines_are_flattened() -> None:
    summary = summarise_refusal({"n1": "cordoned\n(" + "x" * 5000 + ")"})
    assert len(summary) <= MAX_SUMMARY
    assert "\n" not in summary
    assert summary.startswith("n1: cordoned (xxx")
    assert summary.endswith("…")


def test_the_biggest_group_comes_first_and_the_order_is_stable() -> None:
    reasons = {"a": "node is cordoned", "b": "node is lost", "c": "node is lost"}
    assert summarise_refusal(reasons) == "node is lost: 2 nodes; a: node is cordoned"
    assert summarise_refusal(dict(reversed(list(reasons.items())))) == summarise_refusal(reasons)
